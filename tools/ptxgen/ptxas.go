package main

import (
	"bufio"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/gdnkcp/gdnkcp/ptx"
)

var (
	reCompiling = regexp.MustCompile(`Compiling entry function '([^']+)' for '([^']+)'`)
	reProps     = regexp.MustCompile(`Function properties for (\S+)`)
	reFrame     = regexp.MustCompile(`(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads`)
	reUsed      = regexp.MustCompile(`Used (\d+) registers`)
	reSmem      = regexp.MustCompile(`(\d+) bytes smem`)
)

// parsePtxas reads the resource report of `ptxas -v` (nvcc -Xptxas -v) and
// returns, per architecture, the resources of every entry function.
func parsePtxas(out string) (map[string]map[string]*ptx.Resources, error) {
	res := map[string]map[string]*ptx.Resources{}
	var cur *ptx.Resources // entry being compiled
	var props string       // function whose properties follow
	entryArch := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if m := reCompiling.FindStringSubmatch(line); m != nil {
			arch := m[2]
			if res[arch] == nil {
				res[arch] = map[string]*ptx.Resources{}
			}
			if _, dup := res[arch][m[1]]; dup {
				return nil, fmt.Errorf("ptxas output line %d: entry %s compiled twice for %s", n, m[1], arch)
			}
			cur = &ptx.Resources{}
			res[arch][m[1]] = cur
			entryArch[m[1]] = arch
			props = ""
			continue
		}
		if m := reProps.FindStringSubmatch(line); m != nil {
			props = m[1]
			continue
		}
		if m := reFrame.FindStringSubmatch(line); m != nil {
			// Properties of the entry being compiled; those of a called
			// device function are not the entry's.
			if cur != nil && props != "" {
				if arch, ok := entryArch[props]; ok && res[arch][props] == cur {
					cur.StackFrame, _ = strconv.Atoi(m[1])
					cur.SpillStores, _ = strconv.Atoi(m[2])
					cur.SpillLoads, _ = strconv.Atoi(m[3])
				}
			}
			props = ""
			continue
		}
		if m := reUsed.FindStringSubmatch(line); m != nil && cur != nil {
			cur.Registers, _ = strconv.Atoi(m[1])
			if s := reSmem.FindStringSubmatch(line); s != nil {
				cur.SharedStatic, _ = strconv.Atoi(s[1])
			}
			cur = nil // the Used line closes the entry's report
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return res, nil
}
