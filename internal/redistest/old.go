package redistest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
)

// ServeOld answers on l, until t ends, as a Redis server of the given
// version would answer a client's connection handshake (HELLO, which
// servers before 6.0 do not know, then CLIENT SETNAME), INFO and PING,
// and refuses every other command. It stands in for a server older than
// the store supports, the one thing a test cannot start for real: Debian
// 12 packages Redis 7.0 only, and older releases do not build with its
// compiler.
func ServeOld(t testing.TB, l net.Listener, version string) {
	t.Helper()
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			go serveOld(conn, version)
		}
	}()
}

func serveOld(conn net.Conn, version string) {
	defer conn.Close()
	r := bufio.NewReader(conn)
	for {
		args, err := readCommand(r)
		if err != nil {
			return
		}
		var answer string
		switch strings.ToUpper(args[0]) {
		case "CLIENT":
			answer = "+OK\r\n"
		case "PING":
			answer = "+PONG\r\n"
		case "INFO":
			body := "# Server\r\nredis_version:" + version + "\r\nredis_mode:standalone\r\n"
			answer = fmt.Sprintf("$%d\r\n%s\r\n", len(body), body)
		default:
			answer = fmt.Sprintf("-ERR unknown command '%s'\r\n", args[0])
		}
		if _, err := io.WriteString(conn, answer); err != nil {
			return
		}
	}
}

// readCommand reads one command, a RESP array of bulk strings.
func readCommand(r *bufio.Reader) ([]string, error) {
	line, err := r.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "*") {
		return nil, errors.Join(err, fmt.Errorf("not a command: %q", line))
	}
	n, err := strconv.Atoi(strings.TrimSpace(line[1:]))
	if err != nil || n < 1 {
		return nil, fmt.Errorf("bad command length %q", line)
	}
	args := make([]string, n)
	for i := range args {
		head, err := r.ReadString('\n')
		if err != nil || !strings.HasPrefix(head, "$") {
			return nil, errors.Join(err, fmt.Errorf("not a bulk string: %q", head))
		}
		size, err := strconv.Atoi(strings.TrimSpace(head[1:]))
		if err != nil || size < 0 {
			return nil, fmt.Errorf("bad bulk length %q", head)
		}
		buf := make([]byte, size+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, err
		}
		args[i] = string(buf[:size])
	}
	return args, nil
}
