// Package cli is what rdmatap's commands share: the command table and its
// dispatch, the usage error, the endpoint flags of the network commands
// and the placement lab's flags and reports.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
)

// command is a subcommand; each command's package registers its own in
// init.
type command struct {
	name    string
	summary string
	run     func(args []string, stdout, stderr io.Writer) error
}

var commands []command

// Register adds a command to the commands Run dispatches to.
func Register(name, summary string, run func(args []string, stdout, stderr io.Writer) error) {
	commands = append(commands, command{name, summary, run})
}

func usage() string {
	var b strings.Builder
	b.WriteString("usage: rdmatap <command> [flags]\n\ncommands:\n")
	sort.Slice(commands, func(i, j int) bool { return commands[i].name < commands[j].name })
	for _, c := range commands {
		fmt.Fprintf(&b, "  %-9s %s\n", c.name, c.summary)
	}
	b.WriteString("  help      this text\n\nRun \"rdmatap <command> -h\" for a command's flags.\n")
	return b.String()
}

// ErrUsage marks errors that should print the command's usage.
var ErrUsage = errors.New("usage")

// Run runs the command args[0] names with args[1:] and returns the
// process's exit code: 0, 1 for a failure, 2 for bad usage (an error
// matching ErrUsage, an unknown command); the error goes to stderr as one
// line.
func Run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage())
		return 2
	}
	var cmd *command
	for i := range commands {
		if commands[i].name == args[0] {
			cmd = &commands[i]
		}
	}
	if args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		fmt.Fprint(stdout, usage())
		return 0
	}
	if cmd == nil {
		fmt.Fprintf(stderr, "rdmatap: unknown command %q\n\n%s", args[0], usage())
		return 2
	}
	err := cmd.run(args[1:], stdout, stderr)
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, ErrUsage):
		fmt.Fprintf(stderr, "rdmatap %s: %v\n", args[0], err)
		return 2
	default:
		fmt.Fprintf(stderr, "rdmatap %s: %v\n", args[0], err)
		return 1
	}
}

// ParseFlags parses with one-line errors and a -h text.
func ParseFlags(fs *flag.FlagSet, args []string, stderr io.Writer, name, what string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(stderr, "usage: rdmatap %s [flags]\n\n%s\n\n", name, what)
			fs.SetOutput(stderr)
			fs.PrintDefaults()
			return err
		}
		return fmt.Errorf("%w: %v (see rdmatap %s -h)", ErrUsage, err, name)
	}
	return nil
}
