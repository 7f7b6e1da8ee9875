package main

import (
	"os"

	"github.com/rdmatap/rdmatap/cmd/rdmatap/internal/cli"
	_ "github.com/rdmatap/rdmatap/cmd/rdmatap/internal/daemon"
	_ "github.com/rdmatap/rdmatap/cmd/rdmatap/internal/demo"
	_ "github.com/rdmatap/rdmatap/cmd/rdmatap/internal/perftest"
	_ "github.com/rdmatap/rdmatap/cmd/rdmatap/internal/ping"
)

func main() {
	os.Exit(cli.Run(os.Args[1:], os.Stdout, os.Stderr))
}
