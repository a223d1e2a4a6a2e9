package ipvs

// Batched writes: many requests per send (nlconn.ExecutePipelined), one
// round trip for up to nlconn.MaxPipelined of them, their
// acknowledgements read together. The kernel applies the messages of a
// send in order and carries on past a refused one, so a batch leaves the
// table as the same writes one by one would, and each message's answer
// is the error its own call would have returned.

// batchSlot says which write of a batch a message is: the add's index
// and its real server's index (real < 0: the virtual server itself).
type batchSlot struct{ add, real int32 }

// AddRealServers adds reals to vs with masquerading, in their order, as
// AddRealServer for each in turn would, but pipelined. A real server the
// kernel refuses does not stop the ones after it. It returns nil when
// every one was written, else one error per real server, nil for those
// written, each the error AddRealServer would have returned for it.
func (h *Handle) AddRealServers(vs ServiceKey, reals []RealServer) []error {
	var errs []error
	h.writeBatch(func(b []byte, sent []batchSlot, fail func(batchSlot, error)) ([]byte, []batchSlot) {
		return h.appendReals(b, sent, 0, vs, reals, fail)
	}, func(s batchSlot, err error) {
		if errs == nil {
			errs = make([]error, len(reals))
		}
		errs[s.real] = opError(verbAddRealServer, vs, reals[s.real].RealKey, "", err)
	})
	return errs
}

// AddServices creates each virtual server of adds and then adds its real
// servers, in order, as AddVirtualServer and AddRealServers for each in
// turn would (an Existing one's real servers only), all of them
// pipelined: creating thousands of services, or giving thousands their
// endpoints, costs a round trip per nlconn.MaxPipelined messages rather
// than one or two per service. A virtual server that fails validation is not sent, nor are
// its real servers (they get no error of their own).
func (h *Handle) AddServices(adds []ServiceAdd) []ServiceAddErrors {
	var errs []ServiceAddErrors
	h.writeBatch(func(b []byte, sent []batchSlot, fail func(batchSlot, error)) ([]byte, []batchSlot) {
		for i, a := range adds {
			if !a.Existing {
				slot := batchSlot{add: int32(i), real: -1}
				if err := validateVirtualServer(a.VS); err != nil {
					fail(slot, err) // never sent, as by AddVirtualServer
					continue
				}
				b, sent = h.appendServiceMessage(b, cmdNewService, a.VS), append(sent, slot)
			}
			b, sent = h.appendReals(b, sent, int32(i), a.VS.ServiceKey, a.Reals, fail)
		}
		return b, sent
	}, func(s batchSlot, err error) {
		errs = failAdd(errs, adds, s, err)
	})
	return errs
}

// failAdd records err for slot s of adds, making errs when it is the
// first failure.
func failAdd(errs []ServiceAddErrors, adds []ServiceAdd, s batchSlot, err error) []ServiceAddErrors {
	if errs == nil {
		errs = make([]ServiceAddErrors, len(adds))
	}
	a, e := adds[s.add], &errs[s.add]
	if s.real < 0 {
		e.VS = opError(verbAddVirtualServer, a.VS.ServiceKey, RealKey{}, a.VS.Scheduler, err)
		return errs
	}
	if e.Reals == nil {
		e.Reals = make([]error, len(a.Reals))
	}
	e.Reals[s.real] = opError(verbAddRealServer, a.VS.ServiceKey, a.Reals[s.real].RealKey, "", err)
	return errs
}

// appendReals appends a NEW_DEST message for each valid real server of
// reals (add's), and fails the others without sending them.
func (h *Handle) appendReals(b []byte, sent []batchSlot, add int32, vs ServiceKey, reals []RealServer,
	fail func(batchSlot, error)) ([]byte, []batchSlot) {
	for j, rs := range reals {
		slot := batchSlot{add: add, real: int32(j)}
		if err := validateReal(vs, rs); err != nil {
			fail(slot, err) // never sent, as by AddRealServer
			continue
		}
		b, sent = h.appendDestMessage(b, cmdNewDest, vs, rs), append(sent, slot)
	}
	return b, sent
}

// writeBatch sends the messages fill appends (numbering each in sent),
// and hands fail the kernel's refusal of each refused one. fill calls
// fail for what it does not send.
func (h *Handle) writeBatch(fill func([]byte, []batchSlot, func(batchSlot, error)) ([]byte, []batchSlot),
	fail func(batchSlot, error)) {
	h.batchMu.Lock()
	defer h.batchMu.Unlock()
	b, sent := fill(h.batch[:0], h.sent[:0], fail)
	err := h.writes.ExecutePipelined(b, func(j int, err error, _ []byte) {
		if err != nil {
			fail(sent[j], err)
		}
	})
	if err != nil { // a bug in the message encoding: nothing was sent
		for _, s := range sent {
			fail(s, err)
		}
	}
	if cap(b) <= maxKeptBatch {
		h.batch, h.sent = b, sent
	}
}

// maxKeptBatch bounds the batch buffer a Handle keeps between calls: a
// virtual server with thousands of real servers should not pin its
// messages' memory for good, but the deferred writes' flushes (four
// sends' worth, ~1,024 messages of ~120 bytes: sync/deferred.go) reuse
// theirs instead of growing a new one from nothing each time (at start-up
// 5 % of the proxy's CPU profile was that growth, in the sandbox at 10,000
// services).
const maxKeptBatch = 256 << 10
