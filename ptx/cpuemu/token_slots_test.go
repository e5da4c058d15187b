package cpuemu

// tokenSlotBlock is the bytes of one (chunk, value head) token-slot block:
// V'^T (or dV'^T) fp32 [128 features][64 tokens].
const tokenSlotBlock = 32768

// tokenSlots lays fp32 rows [T][HV][128] (V' or dV') out as the token-slot
// blocks gdn_chunk_grads_mma6 reads and the walks' store_vprime_slots write:
// block c*HV + h, row f of 64 fp32, the 32-byte slot of tokens 8u.. at slot
// u ^ ((f % 8) / 2), tokens from the chunk's length on +0.
func tokenSlots(rows []float32, tok0, clen []int32, HV int) []byte {
	out := make([]float32, len(tok0)*HV*tokenSlotBlock/4)
	for ci := range tok0 {
		for h := 0; h < HV; h++ {
			blk := out[(ci*HV+h)*tokenSlotBlock/4:][:tokenSlotBlock/4]
			for f := 0; f < dHead; f++ {
				for i := 0; i < int(clen[ci]); i++ {
					blk[f*64+((i/8)^((f%8)/2))*8+i%8] = rows[((int(tok0[ci])+i)*HV+h)*dHead+f]
				}
			}
		}
	}
	return f32Bytes(out)
}

// reverseOrder is a dispatch order (dispatch_cta in ptx/src/mma.cuh) of n
// CTAs that runs them last to first.
func reverseOrder(n int) []int32 {
	o := make([]int32, n)
	for i := range o {
		o[i] = int32(n - 1 - i)
	}
	return o
}
