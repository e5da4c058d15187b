# ptxas-walks.awk: from the output of nvcc -Xptxas -v, one line a walk entry (a name containing "walk"; every
# entry with -v all=1): "  NAME: REGS regs, N bytes spill stores, M bytes spill loads". Used by
# spill-variants.sh, walk-regs.sh (and land-check.sh's spill gate through walk-regs.sh) and nvcc-check.sh.
/Compiling entry function/ { n = $0; sub(/.*function .?/, "", n); sub(/.? for.*/, "", n) }
/spill stores/ { sp = $0 }
/Used [0-9]+ registers/ {
	if (all || n ~ /walk/) {
		r = $0; sub(/.*Used /, "", r); sub(/ registers.*/, "", r)
		s = sp; sub(/.*bytes stack frame, /, "", s)
		print "  " n ": " r " regs, " s
	}
}
