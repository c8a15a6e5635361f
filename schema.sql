-- pgcluster registry schema.
--
-- The cluster protocol (or an operator) writes these tables; every pgcluster
-- instance reads them, LISTENs on pgcluster_changed and reloads on each change.
-- Safe to run more than once.

CREATE TABLE IF NOT EXISTS pgcluster_nodes (
  cluster   text        NOT NULL DEFAULT 'local',   -- cluster name: a DNS label
  name      text        NOT NULL,                   -- node name: a DNS label
  address   inet        NOT NULL,
  port      integer     NOT NULL DEFAULT 5432 CHECK (port BETWEEN 1 AND 65535),
  role      text        NOT NULL DEFAULT 'unknown', -- 'primary' | 'standby' | 'unknown'
  healthy   boolean     NOT NULL DEFAULT true,      -- the cluster protocol's own view
  heartbeat timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (cluster, name)
);

CREATE TABLE IF NOT EXISTS pgcluster_aliases (
  alias  text PRIMARY KEY,  -- a DNS label
  target text NOT NULL      -- a cluster or another alias
);

CREATE OR REPLACE FUNCTION pgcluster_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('pgcluster_changed', TG_TABLE_NAME);
  RETURN NULL;
END;
$$;

DROP TRIGGER IF EXISTS pgcluster_nodes_changed ON pgcluster_nodes;
CREATE TRIGGER pgcluster_nodes_changed
  AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON pgcluster_nodes
  FOR EACH STATEMENT EXECUTE FUNCTION pgcluster_notify();

DROP TRIGGER IF EXISTS pgcluster_aliases_changed ON pgcluster_aliases;
CREATE TRIGGER pgcluster_aliases_changed
  AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON pgcluster_aliases
  FOR EACH STATEMENT EXECUTE FUNCTION pgcluster_notify();
