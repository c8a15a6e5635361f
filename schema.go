package pgcluster

import _ "embed"

// Schema is schema.sql: the registry tables and the triggers that notify
// pgcluster_changed. It is safe to run more than once.
//
//go:embed schema.sql
var Schema string
