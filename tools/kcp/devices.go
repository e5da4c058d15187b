package main

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/gdnkcp/gdnkcp/archdetect"
	"github.com/gdnkcp/gdnkcp/kcp"
	"github.com/gdnkcp/gdnkcp/loader"
	"github.com/gdnkcp/gdnkcp/sched"
)

func init() { register(newDevicesCmd) }

// The views of the GPUs devices shows; variables so tests can stand in GPUs.
var (
	detectAll = archdetect.DetectAll
	nvmlInfo  = archdetect.NVMLInfo
)

type devicesJSON struct {
	NVML        *nvmlJSON    `json:"nvml"` // null when NVML cannot answer
	NVMLError   string       `json:"nvml_error,omitempty"`
	Driver      bool         `json:"driver"` // a CUDA driver was found
	DriverError string       `json:"driver_error,omitempty"`
	NoGPU       bool         `json:"no_gpu,omitempty"` // a driver that sees no GPU (CUDA_ERROR_NO_DEVICE)
	Devices     []deviceJSON `json:"devices"`
}

type nvmlJSON struct {
	DriverVersion string           `json:"driver_version"`
	Devices       []nvmlDeviceJSON `json:"devices"`
}

type nvmlDeviceJSON struct {
	Index        int    `json:"index"`
	Name         string `json:"name"`
	UUID         string `json:"uuid"`
	CC           string `json:"cc"`
	Architecture string `json:"architecture"`
	MIGSupported bool   `json:"mig_supported"`
	MIGEnabled   bool   `json:"mig_enabled"`
	MIGPending   bool   `json:"mig_pending"`
	MemTotal     uint64 `json:"mem_total"`
	MemFree      uint64 `json:"mem_free"`
}

type deviceJSON struct {
	Ordinal     int    `json:"ordinal"`
	Name        string `json:"name"`
	Arch        string `json:"arch"`
	CC          string `json:"cc"`
	SMs         int    `json:"sms"`
	MemBytes    uint64 `json:"mem_bytes"`
	SharedOptin int    `json:"shared_optin"`
	Blob        string `json:"blob"` // the slot: sm_90a, ..., compute_80
	BlobKind    string `json:"blob_kind"`
	BuiltAs     string `json:"built_as"`
	Reason      string `json:"reason"`
	Forced      bool   `json:"forced"`
	Variant     string `json:"variant"`
	RuleNote    string `json:"rule_note"`
	Kernels     string `json:"kernels"`     // the kernel set kcp run and kcp.NewGPU take here by default
	KernelsWhy  string `json:"kernels_why"` // and why (kcp.KernelsFor)
}

func newDevicesCmd() *cobra.Command {
	var blob string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "devices [--json] [--blob SLOT]",
		Short: "Show every GPU, the kernel blob and kernel set gdnkcp would run on it and why, and its width-rule variant",
		Long: `devices shows NVML's view of every GPU (where NVML answers without a CUDA context: cgo
builds with libnvidia-ml.so.1), then the CUDA driver's: per device its compute capability, SM
count and memory, the blob archdetect would load (exact cubin, family build or PTX fallback)
and why, the kernel set kcp run (--kernels auto) and kcp.NewGPU take there and why, and the
width-rule variant package sched applies. Without a driver it says so and
exits 0. --blob (or the ` + archdetect.EnvBlob + ` environment variable) forces a blob slot: ` +
			strings.Join(archdetect.Slots, ", ") + ".",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if blob != "" && !slices.Contains(archdetect.Slots, blob) {
				return fmt.Errorf("--blob %q: unknown blob slot (want one of %s)", blob, strings.Join(archdetect.Slots, ", "))
			}
			dj, detectErr := gatherDevices(archdetect.Options{Blob: blob})
			var err error
			if asJSON {
				err = writeJSON(cmd.OutOrStdout(), dj)
			} else {
				err = writeDevicesText(cmd.OutOrStdout(), dj)
			}
			if err != nil {
				return err
			}
			return detectErr
		},
	}
	cmd.Flags().StringVar(&blob, "blob", "", "force a blob slot ("+strings.Join(archdetect.Slots, ", ")+")")
	cmd.Flags().BoolVar(&asJSON, "json", false, "write JSON to stdout, nothing else")
	return cmd
}

// gatherDevices collects both views. A missing driver, or a driver that sees
// no GPU, is not an error; any other detection failure is returned after
// what could be collected.
func gatherDevices(opts archdetect.Options) (devicesJSON, error) {
	dj := devicesJSON{Devices: []deviceJSON{}}
	if devs, version, err := nvmlInfo(); err != nil {
		dj.NVMLError = err.Error()
	} else {
		nj := &nvmlJSON{DriverVersion: version, Devices: []nvmlDeviceJSON{}}
		for _, d := range devs {
			nj.Devices = append(nj.Devices, nvmlDeviceJSON{
				Index: d.Index, Name: d.Name, UUID: d.UUID, CC: fmt.Sprintf("%d.%d", d.Major, d.Minor),
				Architecture: d.Architecture, MIGSupported: d.MIGSupported, MIGEnabled: d.MIGEnabled,
				MIGPending: d.MIGPending, MemTotal: d.MemTotal, MemFree: d.MemFree,
			})
		}
		dj.NVML = nj
	}

	profiles, err := detectAll(opts)
	dj.Driver = !errors.Is(err, loader.ErrNoDriver)
	for _, p := range profiles {
		d := deviceJSON{
			Ordinal: p.Ordinal, Name: p.Name, Arch: p.Arch, CC: fmt.Sprintf("%d.%d", p.Major, p.Minor), SMs: p.SMs,
			MemBytes: p.MemBytes, SharedOptin: p.SharedOptin, Blob: p.Target, Reason: p.Reason, Forced: p.Forced,
			Variant: p.Variant,
		}
		if p.Blob != nil {
			d.BlobKind, d.BuiltAs = p.Blob.Kind, p.Blob.BuiltAs
		}
		if r, rerr := sched.RulesFor(p.Variant); rerr == nil {
			d.RuleNote = r.Note
		}
		d.Kernels, d.KernelsWhy = kcp.KernelsFor(p)
		dj.Devices = append(dj.Devices, d)
	}
	if err != nil {
		dj.DriverError = err.Error()
		dj.NoGPU = loader.IsCode(err, loader.ErrorNoDevice)
		if !dj.Driver || dj.NoGPU {
			return dj, nil // no driver or no GPU: said in the output, not a failure
		}
		return dj, err
	}
	return dj, nil
}

func gib(b uint64) string { return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30)) }

func writeDevicesText(w io.Writer, dj devicesJSON) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if dj.NVML == nil {
		fmt.Fprintf(tw, "NVML: not available: %s\n", dj.NVMLError)
	} else {
		fmt.Fprintf(tw, "NVML: driver %s, %d GPU(s)\n", dj.NVML.DriverVersion, len(dj.NVML.Devices))
		for _, d := range dj.NVML.Devices {
			mig := "MIG off"
			switch {
			case !d.MIGSupported:
				mig = "no MIG"
			case d.MIGEnabled:
				mig = "MIG on"
			case d.MIGPending:
				mig = "MIG pending"
			}
			fmt.Fprintf(tw, "  GPU %d:\t%s (CC %s, %s), %s total, %s free, %s\t%s\n", d.Index, d.Name, d.CC,
				d.Architecture, gib(d.MemTotal), gib(d.MemFree), mig, d.UUID)
		}
	}
	fmt.Fprintln(tw)
	switch {
	case !dj.Driver:
		fmt.Fprintf(tw, "CUDA driver: none (%s)\n", dj.DriverError)
		fmt.Fprintln(tw, "  no GPU can be used here; kcp plan needs --arch")
	case dj.NoGPU:
		fmt.Fprintf(tw, "CUDA driver: present, but it sees no GPU (%s)\n", dj.DriverError)
		fmt.Fprintln(tw, "  no GPU can be used here; kcp plan needs --arch")
	default:
		fmt.Fprintf(tw, "CUDA driver: %d GPU(s)\n", len(dj.Devices))
		for _, d := range dj.Devices {
			forced := ""
			if d.Forced {
				forced = ", forced"
			}
			fmt.Fprintf(tw, "  GPU %d: %s (CC %s, %s, %d SMs, %s)\n", d.Ordinal, d.Name, d.CC, d.Arch, d.SMs, gib(d.MemBytes))
			fmt.Fprintf(tw, "    blob:\t%s (%s, built as %s%s): %s\n", d.Blob, d.BlobKind, d.BuiltAs, forced, d.Reason)
			fmt.Fprintf(tw, "    kernels:\t%s: %s\n", d.Kernels, d.KernelsWhy)
			fmt.Fprintf(tw, "    width rule:\tvariant %s, %d SMs: %s\n", d.Variant, d.SMs, d.RuleNote)
		}
		if dj.DriverError != "" {
			fmt.Fprintf(tw, "  error: %s\n", dj.DriverError)
		}
	}
	return tw.Flush()
}
