package ipvs

// WalkVirtualServers implements Interface. For now it collects the whole
// dump through ListVirtualServers; the streaming dump replaces it.
func (h *Handle) WalkVirtualServers(reset func(), fn func(VirtualServer) error) error {
	vss, err := h.ListVirtualServers()
	if err != nil {
		return err
	}
	for _, vs := range vss {
		if err := fn(vs); err != nil {
			return err
		}
	}
	return nil
}

// WalkRealServers implements Interface. For now it collects the whole
// dump through ListRealServers; the streaming dump replaces it.
func (h *Handle) WalkRealServers(vs ServiceKey, reset func(), fn func(RealServer) error) error {
	rss, err := h.ListRealServers(vs)
	if err != nil {
		return err
	}
	for _, rs := range rss {
		if err := fn(rs); err != nil {
			return err
		}
	}
	return nil
}
