package service

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// ListenSocket makes the service's socket at path with mode 0660, owned by
// group gid (-1 keeps the process's group). A socket file no service
// answers on (left by a crashed one) is replaced; a live one, or a path
// that is not a socket, is an error.
//
// The directory is made (mode 0755) if it is missing. An existing one
// must be a directory, not a symbolic link, owned by root or by this
// process's user, and writable by no one else unless it is sticky (as
// /tmp is): whoever may rename entries in it could put a link where the
// socket is about to be and have the service change another file. The
// socket gets its mode from the umask at bind time and its group from a
// call that does not follow a link, so nothing is changed through the path
// after the bind.
func ListenSocket(path string, gid int) (*net.UnixListener, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	if err := checkSocketDir(dir); err != nil {
		return nil, err
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("service socket %s: the path exists and is not a socket", path)
		}
		c, err := net.DialTimeout("unixpacket", path, time.Second)
		if err == nil {
			c.Close()
			return nil, fmt.Errorf("service socket %s is in use by another running service", path)
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("service socket %s: cannot tell whether a service runs on it: %w", path, err)
		}
		os.Remove(path)
	}
	umaskMu.Lock()
	old := syscall.Umask(0o117) // the socket is made 0660
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	syscall.Umask(old)
	umaskMu.Unlock()
	if err != nil {
		return nil, err
	}
	if gid >= 0 {
		if err := unix.Fchownat(unix.AT_FDCWD, path, -1, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			ln.Close()
			return nil, fmt.Errorf("service socket %s: group %d: %w", path, gid, err)
		}
	}
	return ln, nil
}

// umaskMu serializes ListenSocket's change of the process's umask.
var umaskMu sync.Mutex

// SocketDirError says why a service socket's directory is not trusted.
type SocketDirError struct {
	Dir    string
	Reason string
}

func (e *SocketDirError) Error() string {
	return fmt.Sprintf("service socket directory %s is not trusted: %s; it must be a directory owned by root or uid %d that no one else may write to (or a sticky one, as /tmp)",
		e.Dir, e.Reason, os.Geteuid())
}

// checkSocketDir verifies, without following a symbolic link, that dir is
// a directory the socket can be made in safely (see ListenSocket).
func checkSocketDir(dir string) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("service socket directory: %w", err)
	}
	bad := func(format string, args ...any) error {
		return &SocketDirError{Dir: dir, Reason: fmt.Sprintf(format, args...)}
	}
	switch {
	case fi.Mode()&os.ModeSymlink != 0:
		return bad("it is a symbolic link")
	case !fi.IsDir():
		return bad("it is not a directory (%v)", fi.Mode().Type())
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return bad("its owner cannot be read")
	}
	if uid := os.Geteuid(); st.Uid != 0 && int(st.Uid) != uid {
		return bad("it is owned by uid %d", st.Uid)
	}
	if fi.Mode().Perm()&0o022 != 0 && fi.Mode()&os.ModeSticky == 0 {
		return bad("it has mode %#o: others may write to it", fi.Mode().Perm())
	}
	return nil
}
