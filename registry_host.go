package pgcluster

import (
	"path/filepath"
	"strings"

	"github.com/jackc/pgx/v5"
)

// connectedHost returns the address of the server conn is connected to, as
// host:port: with a multi-host DSN (host=a,b port=p,q
// target_session_attrs=read-write), the one that accepted the session, not
// the DSN's first host. A host name in the DSN shows as the address it
// resolved to. A Unix socket shows as its directory and port
// (/run/postgresql:5432), as redact writes one. "" when there is no
// connection.
func connectedHost(conn *pgx.Conn) string {
	if conn == nil || conn.PgConn() == nil || conn.PgConn().Conn() == nil {
		return ""
	}
	addr := conn.PgConn().Conn().RemoteAddr()
	if addr == nil {
		return ""
	}
	s := addr.String()
	if addr.Network() == "unix" {
		// libpq's socket name: <directory>/.s.PGSQL.<port>
		dir, file := filepath.Split(s)
		if port, ok := strings.CutPrefix(file, ".s.PGSQL."); ok {
			return filepath.Clean(dir) + ":" + port
		}
		return s
	}
	return s // a TCP address: 10.0.1.6:5432, [fd00::6]:5432
}

// connectedRegistry is connectedHost with the database, in redact's form
// (host:port/database): what a log line names once a session is up.
func connectedRegistry(conn *pgx.Conn) string {
	h := connectedHost(conn)
	if h == "" {
		return ""
	}
	return h + "/" + conn.Config().Database
}
