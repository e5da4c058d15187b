// Package sched decides, on the host, how wide every sequential walk kernel of
// gdnkcp runs (DESIGN.md §4).
//
// A walk scans the chunks of one segment in order, one CTA per segment, value
// head and column tile. It runs either vh = 128 value columns per CTA (HV CTAs
// per segment) or vh = 64 (2*HV CTAs per segment, each doing the whole chain
// over half the columns). Both forms write bitwise-identical results, so the
// choice is a pure performance decision. It is taken from host integers only:
// the chunk counts of the walked segments, HV, the SM count and the
// width-rule variant of the GPU, through an LPT schedule of the walk's CTAs
// over 2*SM slots (see LPT and Decide).
//
// Two rules are implemented: rule B (the current one) and rule A (the previous
// one, kept for A/B benchmarks). DispatchOrder orders a walk's CTAs so that
// segments of different lengths pack onto the SMs, and MixedWalk / SplitWalk
// split one walk launch between the two widths where one width packs them
// badly. The package is pure integer arithmetic and
// imports nothing of gdnkcp's.
package sched
