package health

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
)

// netCause names a connection error by its type and errno: refused, timeout
// or, for any other failure to connect, unreachable.
func netCause(err error) string {
	switch {
	case isTimeout(err):
		return CauseTimeout
	case errors.Is(err, syscall.ECONNREFUSED):
		return CauseRefused
	default:
		return CauseUnreachable
	}
}

// isTimeout reports a deadline that passed: the context's or a socket's.
func isTimeout(err error) bool {
	var ne net.Error
	return pgconn.Timeout(err) || errors.Is(err, context.DeadlineExceeded) ||
		(errors.As(err, &ne) && ne.Timeout())
}

// pgCodeCause names a PostgreSQL error by its SQLSTATE.
func pgCodeCause(code string) string {
	switch {
	case code == "57P03": // cannot_connect_now: starting up, shutting down, in recovery
		return CauseStartingUp
	case code == "57P01" || code == "57P02": // admin_shutdown, crash_shutdown
		return CauseShuttingDown
	case code == "53300": // too_many_connections
		return CauseTooManyConnections
	case len(code) == 5 && code[:2] == "28": // invalid_authorization_specification, invalid_password
		return CauseAuthFailed
	case code == "42501": // insufficient_privilege: no CONNECT on the database
		return CauseAuthFailed
	case code == "3D000": // invalid_catalog_name
		return CauseNoDatabase
	case code == "08P01": // protocol_violation
		return CauseProtocol
	default:
		return CauseError
	}
}

// connect stages a postgres connection attempt reached.
const (
	stageNone   = iota // no TCP connection made
	stageDialed        // TCP connected, TLS (if any) not done
	stageReady         // TCP connected and TLS (if any) done: the startup exchange began
)

// pgCause names an error of the postgres check: the server's SQLSTATE first,
// then timeouts, refusals, TLS errors, and else by how far the connection got.
func pgCause(err error, stage int) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgCodeCause(pgErr.Code)
	}
	switch {
	case isTimeout(err):
		return CauseTimeout
	case errors.Is(err, syscall.ECONNREFUSED):
		return CauseRefused
	case isTLSError(err):
		return CauseTLS
	}
	switch stage {
	case stageNone:
		return CauseUnreachable
	case stageDialed: // every attempt stopped between the TCP connect and the end of TLS
		return CauseTLS
	default:
		return CauseProtocol
	}
}

// isTLSError reports the errors of crypto/tls and crypto/x509.
func isTLSError(err error) bool {
	var (
		recordErr tls.RecordHeaderError
		alertErr  tls.AlertError
		verifyErr *tls.CertificateVerificationError
		authErr   x509.UnknownAuthorityError
		hostErr   x509.HostnameError
		invalid   x509.CertificateInvalidError
	)
	return errors.As(err, &recordErr) || errors.As(err, &alertErr) || errors.As(err, &verifyErr) ||
		errors.As(err, &authErr) || errors.As(err, &hostErr) || errors.As(err, &invalid)
}
