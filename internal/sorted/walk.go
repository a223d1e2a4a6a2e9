// Package sorted diffs two sorted slices in one merge walk, the step at the
// heart of the reconciler (and of `ipvsproxy diff`).
package sorted

// Walk walks old and new, both sorted by compare, in step, and calls
// onlyOld, onlyNew or both for each key. It allocates nothing.
func Walk[A, B any](old []A, new []B, compare func(a A, b B) int, onlyOld func(A), onlyNew func(B), both func(A, B)) {
	i, j := 0, 0
	for i < len(old) || j < len(new) {
		var c int
		switch {
		case j == len(new):
			c = -1
		case i == len(old):
			c = 1
		default:
			c = compare(old[i], new[j])
		}
		switch {
		case c < 0:
			onlyOld(old[i])
			i++
		case c > 0:
			onlyNew(new[j])
			j++
		default:
			both(old[i], new[j])
			i++
			j++
		}
	}
}
