package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

// command is a subcommand: each file registers its own in init.
type command struct {
	name    string
	summary string
	run     func(args []string, stdout, stderr io.Writer) error
}

var commands []command

func register(c command) { commands = append(commands, c) }

func init() {
	register(command{"demo", "two endpoints in this process over an in-memory link (no root):\n" +
		"            Send/Recv, RDMA Write and RDMA Read, every byte verified", demoCmd})
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

// errUsage marks errors that should print the command's usage.
var errUsage = errors.New("usage")

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
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
	case errors.Is(err, errUsage):
		fmt.Fprintf(stderr, "rdmatap %s: %v\n", args[0], err)
		return 2
	default:
		fmt.Fprintf(stderr, "rdmatap %s: %v\n", args[0], err)
		return 1
	}
}
