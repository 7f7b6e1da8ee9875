// Command rdmatap is the rdmatap endpoint and its tools.
//
//	rdmatap demo [--size N] [--iters N] [--crc] [--pcap FILE]
//
// demo needs no root and no TAP: it connects two endpoints in this process
// over an in-memory link and runs Send/Recv, RDMA Write and RDMA Read,
// verifying every byte.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
)

const usage = `usage: rdmatap <command> [flags]

commands:
  demo     two endpoints in this process over an in-memory link (no root):
           Send/Recv, RDMA Write and RDMA Read, every byte verified
  help     this text

Run "rdmatap <command> -h" for a command's flags.
`

// errUsage marks errors that should print the command's usage.
var errUsage = errors.New("usage")

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var err error
	switch args[0] {
	case "demo":
		err = demoCmd(args[1:], stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "rdmatap: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
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
