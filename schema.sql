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
  PRIMARY KEY (cluster, name),
  -- A heartbeat is a moment: 'infinity' and '-infinity' are refused.
  CONSTRAINT pgcluster_nodes_heartbeat_finite CHECK (isfinite(heartbeat)),
  -- An address is one host: a network such as '10.1.0.0/16' is refused.
  CONSTRAINT pgcluster_nodes_address_host
    CHECK (masklen(address) = CASE family(address) WHEN 4 THEN 32 ELSE 128 END)
);

-- A registry made by an older schema.sql gets the same checks. NOT VALID: the
-- rows already there stay (pgcluster serves none of them and says why in its
-- log and TXT); every row inserted or updated from now on is checked.
DO $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conrelid = 'pgcluster_nodes'::regclass
                 AND conname = 'pgcluster_nodes_heartbeat_finite') THEN
    ALTER TABLE pgcluster_nodes ADD CONSTRAINT pgcluster_nodes_heartbeat_finite
      CHECK (isfinite(heartbeat)) NOT VALID;
  END IF;
  IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conrelid = 'pgcluster_nodes'::regclass
                 AND conname = 'pgcluster_nodes_address_host') THEN
    ALTER TABLE pgcluster_nodes ADD CONSTRAINT pgcluster_nodes_address_host
      CHECK (masklen(address) = CASE family(address) WHEN 4 THEN 32 ELSE 128 END) NOT VALID;
  END IF;
END
$$;

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
