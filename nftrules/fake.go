package nftrules

// Fake is the nftables backend over an in-memory kernel (see
// fakeKernel): the same writer as the real one, so the engine's tests
// exercise the real batching and error handling, and String prints what
// `nft list table inet ipvsproxy` prints. Safe for concurrent use.
type Fake struct {
	*writer
	kernel *fakeKernel
}

var _ Interface = (*Fake)(nil)

// NewFake returns a Fake with no table, writing the table for cfg.
func NewFake(cfg Config) (*Fake, error) {
	k := &fakeKernel{}
	w, err := newWriter(cfg, k)
	if err != nil {
		return nil, err
	}
	return &Fake{writer: w, kernel: k}, nil
}

// String is the `nft list table inet ipvsproxy` text ("" without a table).
func (f *Fake) String() string { return f.kernel.list() }
