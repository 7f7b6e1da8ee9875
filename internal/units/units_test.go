package units

import (
	"errors"
	"flag"
	"io"
	"testing"
)

func TestParseBytes(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int64
	}{{"0", 0}, {"4096", 4096}, {"64K", 64 << 10}, {"64k", 64 << 10}, {"1M", 1 << 20}, {"8G", 8 << 30}, {" 2m ", 2 << 20}} {
		got, err := ParseBytes(c.in, 1<<40)
		if err != nil || got != c.want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d", c.in, got, err, c.want)
		}
	}
	for _, in := range []string{"", "K", "-1", "1.5M", "12T", "64KB", "9223372036854775807G", "2G"} {
		if n, err := ParseBytes(in, 1<<30); !errors.Is(err, ErrSize) {
			t.Errorf("ParseBytes(%q) = %d, %v; want ErrSize", in, n, err)
		}
	}
}

func TestSizeFlag(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	z := Size{N: 64 << 20, Max: 1 << 30}
	fs.Var(&z, "size", "bytes")
	if z.String() != "64M" {
		t.Fatalf("default shown as %q", z.String())
	}
	if err := fs.Parse([]string{"-size", "256M"}); err != nil || z.N != 256<<20 {
		t.Fatalf("-size 256M: %d %v", z.N, err)
	}
	if err := fs.Parse([]string{"-size", "2G"}); err == nil {
		t.Fatal("-size over the maximum accepted")
	}
}

func FuzzParseBytes(f *testing.F) {
	for _, s := range []string{"64K", "1G", "-3", "99999999999999999999M"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseBytes(s, 1<<40)
		if err == nil && (n < 0 || n > 1<<40) {
			t.Fatalf("ParseBytes(%q) = %d", s, n)
		}
	})
}

func TestIntFlag(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	size := -1
	fs.Var(Int{P: &size, Max: 8 << 20}, "s", "message size")
	if err := fs.Parse([]string{"-s", "64K"}); err != nil || size != 64<<10 {
		t.Fatalf("-s 64K: %d %v", size, err)
	}
	if err := fs.Parse([]string{"-s", "4096"}); err != nil || size != 4096 {
		t.Fatalf("-s 4096: %d %v", size, err)
	}
	if err := fs.Parse([]string{"-s", "16M"}); err == nil {
		t.Fatal("-s over the maximum accepted")
	}
}
