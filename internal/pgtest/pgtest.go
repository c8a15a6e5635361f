// Package pgtest starts real PostgreSQL servers for tests and for the demo.
//
// A server runs from a temporary directory on a free port of a loopback
// address (127.0.0.1 unless Options.Host names another). PostgreSQL refuses to
// run as root, so when the caller is root every server command runs as the
// postgres user through runuser. Nothing is faked: callers get a real
// postmaster they can stop, start again and connect to.
//
// Every server trusts connections, replication ones included, from the whole
// of 127.0.0.0/8 and ::1, and runs with wal_level replica, so any server can
// be the primary of a standby made by StartStandby (see replication.go).
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgcluster/pgcluster/internal/proc"
)

// Postgres is one running (or stopped) PostgreSQL server.
type Postgres struct {
	// Host is the loopback address the server listens on (127.0.0.1 by default).
	Host string
	// Port is the TCP port the server listens on, on Host.
	Port int
	// Dir is the temporary directory holding the data directory, socket and log.
	Dir string

	bin     string
	uid     *user.User
	runAsPG bool
}

// DefaultHost is the address a server listens on when Options.Host is empty.
const DefaultHost = "127.0.0.1"

// Options tune Start and StartStandby.
type Options struct {
	// Host is the loopback address to listen on ("127.0.0.2", "::1", …); ""
	// means DefaultHost, or the single address of Settings["listen_addresses"]
	// when that names one. Any address of 127.0.0.0/8 works on Linux without
	// configuration. Host and Port are what DSN uses.
	Host string
	// Port to listen on; 0 picks a free one.
	Port int
	// Dir is the parent of the server's temporary directory; "" means os.TempDir().
	Dir string
	// Settings are extra "-c name=value" server settings.
	Settings map[string]string
	// TLS, when set, is the certificate the server presents: it starts with
	// ssl = on (see tls.go). Connections may still be made without TLS.
	TLS *TLS
}

// host returns the address the server is to listen on, or an error when it
// is not a loopback address: tests never listen elsewhere.
func (o Options) host() (string, error) {
	h := o.Host
	if h == "" {
		// The demo used to pick its addresses with listen_addresses alone.
		if la := o.Settings["listen_addresses"]; net.ParseIP(la) != nil {
			h = la
		} else {
			h = DefaultHost
		}
	}
	ip := net.ParseIP(h)
	if ip == nil || !ip.IsLoopback() {
		return "", fmt.Errorf("pgtest: Options.Host %q is not a loopback IP address: use one of 127.0.0.0/8 (127.0.0.2, …) or ::1", h)
	}
	return h, nil
}

// hbaConf lets every loopback address in, for queries and for replication:
// initdb's template trusts 127.0.0.1 alone, and a standby on 127.0.0.3
// connects to its primary from 127.0.0.3.
const hbaConf = "host all all 127.0.0.0/8 trust\nhost replication all 127.0.0.0/8 trust\n"

// BinDir returns the directory holding initdb and pg_ctl: $PGBIN when set, else
// the newest /usr/lib/postgresql/*/bin that has them.
func BinDir() (string, error) {
	if d := os.Getenv("PGBIN"); d != "" {
		return d, nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Sort(sort.Reverse(sort.StringSlice(dirs)))
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	return "", errors.New("PostgreSQL server binaries (initdb, pg_ctl) not found: install postgresql (apt-get install -y postgresql) or set PGBIN")
}

var (
	templateOnce sync.Once
	templateDir  string
	templateErr  error
)

// Start initialises (from a per-process template made by initdb once) and
// starts a PostgreSQL server.
func Start(opts Options) (*Postgres, error) {
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	host, err := opts.host()
	if err != nil {
		return nil, err
	}
	p, err := newPostgres(bin, host)
	if err != nil {
		return nil, err
	}
	templateOnce.Do(func() { templateDir, templateErr = p.initTemplate() })
	if templateErr != nil {
		return nil, templateErr
	}
	if p.Dir, err = p.mkdir(opts.Dir, "pgtest-"); err != nil {
		return nil, err
	}
	if out, err := p.run("cp", "-a", templateDir, p.data()); err != nil {
		os.RemoveAll(p.Dir)
		return nil, fmt.Errorf("copy template data directory: %v: %s", err, out)
	}
	if err := p.serve(opts, "fsync = off\nfull_page_writes = off\nmax_connections = 200\n"+
		"wal_level = replica\nmax_wal_senders = 10\n"); err != nil {
		return nil, err
	}
	return p, nil
}

// serve configures the server in p.Dir (its own settings, then base, then
// opts.Settings; opts.TLS) and starts it on opts.Port, a free port for 0. On
// failure it removes p.Dir.
func (p *Postgres) serve(opts Options, base string) error {
	err := p.configure(opts.Settings, base)
	if err == nil {
		err = p.configureTLS(opts.TLS)
	}
	if err == nil {
		err = p.listen(opts.Port)
	}
	if err != nil {
		os.RemoveAll(p.Dir)
	}
	return err
}

// newPostgres returns a server (not yet made) that runs bin's commands as the
// postgres user when the caller is root.
func newPostgres(bin, host string) (*Postgres, error) {
	p := &Postgres{Host: host, bin: bin, runAsPG: os.Geteuid() == 0}
	if p.runAsPG {
		var err error
		if p.uid, err = user.Lookup("postgres"); err != nil {
			return nil, fmt.Errorf("running as root, PostgreSQL must run as the postgres user, which does not exist: %w", err)
		}
	}
	return p, nil
}

// configure appends the server's own settings to the data directory's
// postgresql.conf (where the last line naming a setting wins): its address
// and socket directory, then base, then settings (so a listen_addresses there
// wins, as it always has); and lets every loopback address in through
// pg_hba.conf.
func (p *Postgres) configure(settings map[string]string, base string) error {
	conf := "listen_addresses = '" + p.Host + "'\nunix_socket_directories = '" + p.Dir + "'\n" + base
	for k, v := range settings {
		conf += k + " = '" + v + "'\n"
	}
	if err := appendFile(filepath.Join(p.data(), "postgresql.conf"), conf); err != nil {
		return err
	}
	return appendFile(filepath.Join(p.data(), "pg_hba.conf"), hbaConf)
}

// listen starts the server on port, or on a free port of p.Host when port is
// 0, trying another one if a port is taken between the pick and the start.
func (p *Postgres) listen(port int) error {
	var err error
	p.Port = port
	for attempt := 0; ; attempt++ {
		if port == 0 {
			if p.Port, err = proc.FreePortOn(p.Host); err != nil {
				return err
			}
		}
		if err = p.Start(); err == nil || port != 0 || attempt == 3 {
			return err
		}
	}
}

// initTemplate returns a data directory made by initdb, shared by every
// process of this user and PostgreSQL version: made once in a directory of
// its own, then renamed into place, so concurrent test binaries never see a
// half-made one and nothing is left behind per run.
func (p *Postgres) initTemplate() (string, error) {
	final := filepath.Join(os.TempDir(), fmt.Sprintf("pgcluster-pgtest-template-%d-%s", os.Geteuid(), filepath.Base(filepath.Dir(p.bin))))
	if _, err := os.Stat(filepath.Join(final, "data", "PG_VERSION")); err == nil {
		return filepath.Join(final, "data"), nil
	}
	dir, err := p.mkdir("", "pgtest-template-")
	if err != nil {
		return "", err
	}
	out, err := p.run(filepath.Join(p.bin, "initdb"), "-D", filepath.Join(dir, "data"), "-U", "postgres",
		"--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync")
	if err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("initdb: %v: %s", err, out)
	}
	if err := os.Rename(dir, final); err != nil {
		// Another process got there first: use its template.
		os.RemoveAll(dir)
		if _, serr := os.Stat(filepath.Join(final, "data", "PG_VERSION")); serr != nil {
			return "", fmt.Errorf("template data directory: %w", err)
		}
	}
	return filepath.Join(final, "data"), nil
}

// mkdir makes a temporary directory the server's user owns.
func (p *Postgres) mkdir(parent, pattern string) (string, error) {
	dir, err := os.MkdirTemp(parent, pattern)
	if err != nil {
		return "", err
	}
	if p.runAsPG {
		uid, _ := strconv.Atoi(p.uid.Uid)
		gid, _ := strconv.Atoi(p.uid.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			return "", err
		}
	}
	return dir, nil
}

func (p *Postgres) data() string { return filepath.Join(p.Dir, "data") }

func appendFile(name, text string) error {
	f, err := os.OpenFile(name, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(text)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// run runs a command as the server's user.
func (p *Postgres) run(name string, args ...string) ([]byte, error) {
	if p.runAsPG {
		args = append([]string{"-u", "postgres", "--", name}, args...)
		name = "runuser"
	}
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	return cmd.CombinedOutput()
}

// Start starts a stopped server on its port and waits until it accepts connections.
func (p *Postgres) Start() error {
	out, err := p.run(filepath.Join(p.bin, "pg_ctl"), "-D", p.data(), "-l", filepath.Join(p.Dir, "log"),
		"-o", "-p "+strconv.Itoa(p.Port), "-w", "-t", "60", "start")
	if err != nil {
		return fmt.Errorf("pg_ctl start on %s: %v: %s%s", p.HostPort(), err, out, p.logTail())
	}
	return nil
}

// Stop stops the server at once (immediate mode: connections are cut as by a crash).
func (p *Postgres) Stop() error {
	out, err := p.run(filepath.Join(p.bin, "pg_ctl"), "-D", p.data(), "-m", "immediate", "-w", "stop")
	if err != nil {
		return fmt.Errorf("pg_ctl stop: %v: %s", err, out)
	}
	return nil
}

// StopMode stops the server with pg_ctl's shutdown mode ("smart", "fast" or
// "immediate") and waits until it has stopped: fast ends every session
// with SQLSTATE 57P01 first; smart waits until every session has ended,
// refusing new ones with 57P03 meanwhile.
func (p *Postgres) StopMode(mode string) error {
	out, err := p.run(filepath.Join(p.bin, "pg_ctl"), "-D", p.data(), "-m", mode, "-w", "-t", "60", "stop")
	if err != nil {
		return fmt.Errorf("pg_ctl stop -m %s: %v: %s", mode, err, out)
	}
	return nil
}

// Close stops the server and removes its directory.
func (p *Postgres) Close() {
	p.run(filepath.Join(p.bin, "pg_ctl"), "-D", p.data(), "-m", "immediate", "-w", "stop")
	os.RemoveAll(p.Dir)
}

func (p *Postgres) logTail() string {
	b, _ := os.ReadFile(filepath.Join(p.Dir, "log"))
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	if len(b) == 0 {
		return ""
	}
	return "\nserver log:\n" + string(b)
}

// DSN returns a connection string for database db ("" means postgres).
func (p *Postgres) DSN(db string) string {
	if db == "" {
		db = "postgres"
	}
	return fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable", p.HostPort(), db)
}

// HostPort is the server's address and port, as "127.0.0.2:5432" or
// "[::1]:5432".
func (p *Postgres) HostPort() string { return net.JoinHostPort(p.host(), strconv.Itoa(p.Port)) }

// host is the address to connect to: Host, or DefaultHost for a Postgres
// value made without one.
func (p *Postgres) host() string {
	if p.Host == "" {
		return DefaultHost
	}
	return p.Host
}

// Exec runs SQL statements (several may be separated by semicolons) in database postgres.
func (p *Postgres) Exec(ctx context.Context, sql string, args ...any) error {
	conn, err := pgx.Connect(ctx, p.DSN(""))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql, args...)
	return err
}

// WaitFor polls cond until it returns nil or the deadline passes, and returns
// the last error.
func WaitFor(timeout time.Duration, cond func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after %v: %w", timeout, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
