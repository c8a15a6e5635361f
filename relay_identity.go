package pgcluster

import (
	"context"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// registryID names the registry a fleet follows: the system identifier of
// its PostgreSQL cluster (one per initdb, the same on its standbys), the
// database the DSN names, and the zones served from it. The follower names
// it in the head of every copy it writes, and an instance refuses a copy
// of another registry: two fleets that share a Redis prefix by mistake
// (the same first zone gives the same default prefix) each serve their
// own registry, not the other's.
type registryID struct {
	sys   uint64 // 0 until learned: an instance reads it from PostgreSQL
	db    string
	zones string
}

// systemIDQuery reads the registry's system identifier (bigint: shown
// signed, kept as the uint64 it is).
const systemIDQuery = "SELECT system_identifier FROM pg_control_system()"

// identifyTimeout bounds one reading of the system identifier.
const identifyTimeout = 2 * time.Second

// configRegistryID is the registry set names, but for its system
// identifier: the database of the DSN (PostgreSQL's default, the user's
// name, when it names none) and the zones.
func configRegistryID(set *settings) registryID {
	id := registryID{zones: strings.Join(set.zones, ",")}
	if cfg, err := pgx.ParseConfig(set.dsn); err == nil {
		id.db = cfg.Database
		if id.db == "" {
			id.db = cfg.User
		}
	}
	return id
}

// String is id as a copy's head names it.
func (id registryID) String() string {
	return strconv.FormatUint(id.sys, 10) + " " + url.PathEscape(id.db) + " " + id.zones
}

// parseRegistryID reads a registry's name as String writes it.
func parseRegistryID(s string) (registryID, bool) {
	parts := strings.Split(s, " ")
	if len(parts) != 3 {
		return registryID{}, false
	}
	sys, err := strconv.ParseUint(parts[0], 10, 64)
	if err != nil {
		return registryID{}, false
	}
	db, err := url.PathUnescape(parts[1])
	if err != nil {
		return registryID{}, false
	}
	return registryID{sys: sys, db: db, zones: parts[2]}, true
}

// names reports whether a copy whose head names name is a copy of id: the
// same database and zones, and, once this instance has learned it, the
// same system identifier. A copy that names no system identifier names no
// registry.
func (id registryID) names(name string) bool {
	other, ok := parseRegistryID(name)
	return ok && other.sys != 0 && other.db == id.db && other.zones == id.zones && (id.sys == 0 || other.sys == id.sys)
}

// readSystemID reads the registry's system identifier in a session of its
// own, closed at once: named coredns-pgcluster-identity (unless the DSN
// names one), so that it is not taken for a registry session.
func readSystemID(ctx context.Context, dsn string) (uint64, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return 0, err
	}
	if cfg.ConnectTimeout == 0 || cfg.ConnectTimeout > identifyTimeout {
		cfg.ConnectTimeout = identifyTimeout
	}
	if cfg.RuntimeParams["application_name"] == "" {
		cfg.RuntimeParams["application_name"] = "coredns-pgcluster-identity"
	}
	ctx, cancel := context.WithTimeout(ctx, identifyTimeout)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return 0, err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
		conn.Close(cctx)
		cancel()
	}()
	var sys int64
	if err := conn.QueryRow(ctx, systemIDQuery).Scan(&sys); err != nil {
		return 0, err
	}
	return uint64(sys), nil
}
