package main

import (
	"os"

	"github.com/rdmatap/rdmatap/cmd/rdmatap/internal/cli"
	// Each command's package registers its commands with cli in init.
	_ "github.com/rdmatap/rdmatap/cmd/rdmatap/internal/daemon"
	_ "github.com/rdmatap/rdmatap/cmd/rdmatap/internal/demo"
	_ "github.com/rdmatap/rdmatap/cmd/rdmatap/internal/perftest"
	_ "github.com/rdmatap/rdmatap/cmd/rdmatap/internal/ping"
	_ "github.com/rdmatap/rdmatap/cmd/rdmatap/internal/progexec"
)

// main hands the command line to the command it names.
func main() {
	os.Exit(cli.Run(os.Args[1:], os.Stdout, os.Stderr))
}
