package cli

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"testing"
)

// TestRun: Run's exit codes and messages for each kind of outcome of a
// command, for help and for an unknown command.
func TestRun(t *testing.T) {
	Register("tfail", "fails", func([]string, io.Writer, io.Writer) error { return errors.New("it broke") })
	Register("tusage", "bad usage", func(args []string, _, _ io.Writer) error {
		return fmt.Errorf("%w: --x %q: want a number", ErrUsage, args[0])
	})
	Register("thelp", "-h", func(_ []string, _, stderr io.Writer) error {
		fs := flag.NewFlagSet("thelp", flag.ContinueOnError)
		fs.Int("n", 1, "a number")
		return ParseFlags(fs, []string{"-h"}, stderr, "thelp", "What thelp does.")
	})
	Register("tok", "succeeds", func(args []string, stdout, _ io.Writer) error {
		fmt.Fprintln(stdout, strings.Join(args, ","))
		return nil
	})
	for _, tc := range []struct {
		args        []string
		code        int
		out, errOut string
	}{
		{[]string{"tok", "a", "b"}, 0, "a,b\n", ""},
		{[]string{"tfail"}, 1, "", "rdmatap tfail: it broke\n"},
		{[]string{"tusage", "y"}, 2, "", "rdmatap tusage: usage: --x \"y\": want a number\n"},
		{[]string{"thelp"}, 0, "", "usage: rdmatap thelp [flags]\n\nWhat thelp does.\n\n  -n int\n    \ta number (default 1)\n"},
		{[]string{"nope"}, 2, "", "rdmatap: unknown command \"nope\"\n\n" + usage()},
		{nil, 2, "", usage()},
		{[]string{"help"}, 0, usage(), ""},
	} {
		var out, errOut bytes.Buffer
		code := Run(tc.args, &out, &errOut)
		if code != tc.code || out.String() != tc.out || errOut.String() != tc.errOut {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want %d, %q, %q", tc.args, code, out.String(), errOut.String(), tc.code, tc.out, tc.errOut)
		}
	}
	u := usage()
	if !strings.Contains(u, "  tfail     fails\n") || strings.Index(u, "tfail") > strings.Index(u, "tok ") {
		t.Errorf("usage does not list the commands in order:\n%s", u)
	}
}

// TestParseFlagsError: a bad flag is a one-line ErrUsage naming the
// command's -h.
func TestParseFlagsError(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Int("n", 1, "")
	err := ParseFlags(fs, []string{"-n", "many"}, io.Discard, "x", "")
	if !errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), "rdmatap x -h") || strings.Contains(err.Error(), "\n") {
		t.Errorf("%v", err)
	}
}
