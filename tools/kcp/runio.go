package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"

	"github.com/gdnkcp/gdnkcp/internal/bf16"
	"github.com/gdnkcp/gdnkcp/internal/npy"
	"github.com/gdnkcp/gdnkcp/kcp"
)

// runMeta is DIR/meta.json of --dump and --inputs.
type runMeta struct {
	Pack    string            `json:"pack"`
	Docs    []int             `json:"docs"`
	CP      int               `json:"cp"`
	Layout  string            `json:"layout"`
	Stage   string            `json:"stage"`
	Mode    string            `json:"mode"`
	Backend string            `json:"backend"`
	Seed    uint64            `json:"seed"`
	Heads   map[string]int    `json:"heads"` // qk, v
	Dims    map[string]int    `json:"dims"`  // k, v
	Scale   float64           `json:"scale"`
	L2Norm  bool              `json:"l2norm"`
	Flags   map[string]string `json:"flags"`
	DTypes  map[string]string `json:"dtypes"`
}

// dumpRun writes inputs, dout, the output o ([]float64 or []float32, of
// dtype oDtype as meta.json records it) and, when g is set, the gradients as
// .npy files, and meta.json, into dir.
func dumpRun(dir string, rep *runReport, plan *kcp.Plan, stage kcp.Stage, in *kcp.Inputs, dout []float32, o any, oDtype string, g *kcp.Grads) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("--dump: %w", err)
	}
	cfg := plan.Config
	meta := runMeta{
		Pack: rep.Pack, Docs: cfg.Docs, CP: cfg.Ranks, Layout: string(cfg.Layout), Stage: string(stage), Mode: rep.Mode,
		Backend: rep.Backend, Seed: rep.Seed,
		Heads:  map[string]int{"qk": cfg.HQK, "v": cfg.HV},
		Dims:   map[string]int{"k": cfg.DK, "v": cfg.DV},
		Scale:  1 / math.Sqrt(float64(cfg.DK)),
		L2Norm: true,
		Flags:  map[string]string{"profile": rep.Profile, "rule": rep.Rule, "force_vh": fmt.Sprint(rep.ForceVH)},
		DTypes: map[string]string{},
	}
	write := func(name string, shape []int, data any, dtype string) error {
		meta.DTypes[name] = dtype
		if err := npy.WriteFile(filepath.Join(dir, name+".npy"), shape, data); err != nil {
			return fmt.Errorf("--dump: %w", err)
		}
		return nil
	}
	shapes := plan.InputShapes(stage)
	inputs := [][]float32{in.Q, in.K, in.V, in.G, in.Beta, in.ConvW}
	for i, sh := range shapes {
		dt := "float32 holding bf16 values"
		if sh.Name == "g" || sh.Name == "beta" {
			dt = "float32"
		}
		if err := write(sh.Name, sh.Shape, inputs[i], dt); err != nil {
			return err
		}
	}
	oshape := plan.OutputShape().Shape
	if err := write("dout", oshape, dout, "float32 holding bf16 values"); err != nil {
		return err
	}
	if err := write("o", oshape, o, oDtype+" ("+rep.Backend+" backend)"); err != nil {
		return err
	}
	if rep.GPU != nil {
		meta.Flags["blob"] = rep.GPU.Blob
	}
	var grads []kcp.Named
	if g != nil {
		grads = g.Tensors()
	}
	for i, t := range grads {
		if err := write(t.Name, shapes[min(i, len(shapes)-1)].Shape, t.Data, "float64 ("+rep.Backend+" backend)"); err != nil {
			return err
		}
	}
	raw, err := json.MarshalIndent(meta, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "meta.json"), append(raw, '\n'), 0o644); err != nil {
		return fmt.Errorf("--dump: %w", err)
	}
	return nil
}

// readMeta reads dir/meta.json; a missing file gives nil, nil.
func readMeta(dir string) (*runMeta, error) {
	raw, err := os.ReadFile(filepath.Join(dir, "meta.json"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("--inputs: %w", err)
	}
	var m runMeta
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("--inputs: %s: %w", filepath.Join(dir, "meta.json"), err)
	}
	return &m, nil
}

// readTensor reads dir/name.npy as float32 and checks its rank.
func readTensor(dir, name string, rank int, dims string) ([]float32, []int, error) {
	path := filepath.Join(dir, name+".npy")
	a, err := npy.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("--inputs: %w", err)
	}
	if len(a.Shape) != rank {
		return nil, nil, fmt.Errorf("--inputs: %s: shape %v has %d dims, want %d %s", path, a.Shape, len(a.Shape), rank, dims)
	}
	data, err := a.Float32()
	if err != nil {
		return nil, nil, fmt.Errorf("--inputs: %w", err)
	}
	return data, a.Shape, nil
}

// loadInputs reads --inputs DIR: the tensors, their shapes (which give the
// head counts and dims) and the documents (flags, else meta.json).
func (o *runOptions) loadInputs(changed func(string) bool, layout kcp.Layout, stage kcp.Stage) (*kcp.Plan, string, *kcp.Inputs, []float32, error) {
	dir := o.inputs
	meta, err := readMeta(dir)
	if err != nil {
		return nil, "", nil, nil, err
	}
	q, qs, err := readTensor(dir, "q", 3, "[T, H_qk, K]")
	if err != nil {
		return nil, "", nil, nil, err
	}
	v, vs, err := readTensor(dir, "v", 3, "[T, HV, V]")
	if err != nil {
		return nil, "", nil, nil, err
	}
	T, hqk, dk, hv, dv := qs[0], qs[1], qs[2], vs[1], vs[2]
	if meta != nil {
		for _, c := range []struct {
			what      string
			meta, got int
		}{{"heads.qk", meta.Heads["qk"], hqk}, {"heads.v", meta.Heads["v"], hv}, {"dims.k", meta.Dims["k"], dk}, {"dims.v", meta.Dims["v"], dv}} {
			if c.meta != 0 && c.meta != c.got {
				return nil, "", nil, nil, fmt.Errorf("--inputs: meta.json says %s = %d but the .npy shapes give %d", c.what, c.meta, c.got)
			}
		}
	}
	name, docs := "", []int(nil)
	switch {
	case changed("pack") || changed("docs"):
		if name, docs, err = o.runDocs(changed); err != nil {
			return nil, "", nil, nil, err
		}
	case meta != nil && len(meta.Docs) > 0:
		name, docs = meta.Pack, meta.Docs
	default:
		return nil, "", nil, nil, fmt.Errorf("--inputs %s: no meta.json with docs; give --docs or --pack", dir)
	}
	cp := o.cp
	if !changed("cp") && meta != nil && meta.CP > 0 {
		cp = meta.CP
	}
	if !changed("layout") && meta != nil && meta.Layout != "" {
		if layout, err = kcp.ParseLayout(meta.Layout); err != nil {
			return nil, "", nil, nil, fmt.Errorf("--inputs: meta.json: %w", err)
		}
	}
	plan, err := kcp.NewPlan(kcp.PlanConfig{Docs: docs, Ranks: cp, Layout: layout, HQK: hqk, HV: hv, DK: dk, DV: dv})
	if err != nil {
		return nil, "", nil, nil, err
	}
	if plan.Tokens != T {
		return nil, "", nil, nil, fmt.Errorf("--inputs: q.npy has T = %d tokens but the documents sum to %d", T, plan.Tokens)
	}
	in := &kcp.Inputs{Q: q, V: v}
	want := plan.InputShapes(stage)
	read := map[string]*[]float32{"k": &in.K, "g": &in.G, "beta": &in.Beta, "conv_w": &in.ConvW}
	for _, sh := range want {
		dst, ok := read[sh.Name]
		if !ok {
			continue
		}
		data, shape, err := readTensor(dir, sh.Name, len(sh.Shape), sh.Dims)
		if err != nil {
			return nil, "", nil, nil, err
		}
		if fmt.Sprint(shape) != fmt.Sprint(sh.Shape) {
			return nil, "", nil, nil, fmt.Errorf("--inputs: %s.npy: shape %v, want %v %s", sh.Name, shape, sh.Shape, sh.Dims)
		}
		*dst = data
	}
	in.RoundBF16()
	osh := plan.OutputShape()
	dout, shape, err := readTensor(dir, "dout", 3, osh.Dims)
	if err != nil {
		return nil, "", nil, nil, err
	}
	if fmt.Sprint(shape) != fmt.Sprint(osh.Shape) {
		return nil, "", nil, nil, fmt.Errorf("--inputs: dout.npy: shape %v, want %v %s", shape, osh.Shape, osh.Dims)
	}
	for i, x := range dout {
		dout[i] = bf16.Round(x)
	}
	return plan, name, in, dout, nil
}
