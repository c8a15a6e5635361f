package discovery

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/multitracer"
)

// connectReporter is a pgx tracer that reports each failed connection
// attempt to the Watcher: pgx calls no other hook when the server refuses
// a connection after the dial (SQLSTATE 57P03 while it shuts down or
// starts, a failed read-write check).
type connectReporter struct{ w *Watcher }

// TraceQueryStart does nothing: pgx.ConnConfig.Tracer must trace queries.
func (r connectReporter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

// TraceQueryEnd does nothing.
func (r connectReporter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TraceConnectStart does nothing.
func (r connectReporter) TraceConnectStart(ctx context.Context, _ pgx.TraceConnectStartData) context.Context {
	return ctx
}

// TraceConnectEnd reports a failed attempt, unless its context ended.
func (r connectReporter) TraceConnectEnd(ctx context.Context, data pgx.TraceConnectEndData) {
	if data.Err != nil && ctx.Err() == nil {
		r.w.ReportError(data.Err)
	}
}

// withConnectReporter returns tracer (nil for none) with the Watcher's
// connectReporter added; a tracer of the caller keeps every interface it
// has (multitracer calls each one that implements it).
func withConnectReporter(tracer pgx.QueryTracer, w *Watcher) pgx.QueryTracer {
	if tracer == nil {
		return connectReporter{w}
	}
	return multitracer.New(tracer, connectReporter{w})
}
