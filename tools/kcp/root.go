package main

import (
	"fmt"

	"github.com/spf13/cobra"
)

// commands holds the constructors of the subcommands; each command's file
// registers its own in an init function.
var commands []func() *cobra.Command

// register adds a subcommand constructor.
func register(newCmd func() *cobra.Command) { commands = append(commands, newCmd) }

// newRootCmd builds a fresh command tree (tests build one per run).
func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "kcp",
		Short: "gdnkcp: deterministic context-parallel Gated DeltaNet",
		Long: "kcp plans how a packed batch of documents is split over context-parallel ranks\n" +
			"and which width every walk kernel launch takes.",
		SilenceErrors: true, // run prints the error once, to stderr
		SilenceUsage:  true,
	}
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return fmt.Errorf("%w (see %s --help)", err, cmd.CommandPath())
	})
	root.CompletionOptions.DisableDefaultCmd = true
	for _, newCmd := range commands {
		root.AddCommand(newCmd())
	}
	return root
}
