-- pgcluster registry schema.
--
-- The cluster protocol (or an operator) writes these tables; every pgcluster
-- instance reads them, LISTENs on pgcluster_changed and reads again what
-- each notification says changed.
-- Safe to run more than once.

CREATE TABLE IF NOT EXISTS pgcluster_nodes (
  cluster   text        NOT NULL DEFAULT 'local',   -- cluster name: a DNS label
  name      text        NOT NULL,                   -- node name: a DNS label
  address   inet        NOT NULL,
  port      integer     NOT NULL DEFAULT 5432 CHECK (port BETWEEN 1 AND 65535),
  role      text        NOT NULL DEFAULT 'unknown', -- 'primary' | 'standby' | 'unknown'
  healthy   boolean     NOT NULL DEFAULT true,      -- the cluster protocol's own view
  heartbeat timestamptz NOT NULL DEFAULT now(),
  region    text,                                   -- where the node runs: a DNS label, NULL unknown
  zone      text,                                   -- within the region: a DNS label, NULL unknown
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

-- A registry made before nodes had a place gets the columns, NULL (unknown)
-- for every row there. Looked up first: ALTER TABLE would lock the table
-- against the followers' reads even when the column is there.
DO $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = 'pgcluster_nodes'::regclass
                 AND attname = 'region' AND NOT attisdropped) THEN
    ALTER TABLE pgcluster_nodes ADD COLUMN region text;
  END IF;
  IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = 'pgcluster_nodes'::regclass
                 AND attname = 'zone' AND NOT attisdropped) THEN
    ALTER TABLE pgcluster_nodes ADD COLUMN zone text;
  END IF;
END
$$;

CREATE TABLE IF NOT EXISTS pgcluster_aliases (
  alias  text PRIMARY KEY,  -- a DNS label
  target text NOT NULL      -- a cluster or another alias
);

-- An alias may fail over: while its target does not serve (failover_when:
-- no_primary, no serving primary; no_nodes, no serving node at all) for
-- failover_after, it moves to the first of fallback that serves, forward
-- only, and stays there until an operator fails it back (pgclusterctl
-- failback, which deletes its pgcluster_alias_state row) or, with
-- failback 'auto', until its target serves again for failover_after.
DO $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = 'pgcluster_aliases'::regclass
                 AND attname = 'fallback' AND NOT attisdropped) THEN
    ALTER TABLE pgcluster_aliases
      ADD COLUMN fallback       text[]   NOT NULL DEFAULT '{}',
      ADD COLUMN failover_when  text     NOT NULL DEFAULT 'no_primary'
        CONSTRAINT pgcluster_aliases_failover_when CHECK (failover_when IN ('no_primary', 'no_nodes')),
      ADD COLUMN failover_after interval NOT NULL DEFAULT '30 seconds'
        CONSTRAINT pgcluster_aliases_failover_after CHECK (failover_after >= '0'),
      ADD COLUMN failback       text     NOT NULL DEFAULT 'manual'
        CONSTRAINT pgcluster_aliases_failback CHECK (failback IN ('manual', 'auto'));
  END IF;
END
$$;

-- Where an alias that failed over points now, and why: written only by
-- the fleet's registry follower (a role granted INSERT, UPDATE and SELECT
-- on this one table), each write fenced by its relay term so that a
-- follower whose term has passed cannot undo a newer one's move. No row:
-- the alias points at its target.
CREATE TABLE IF NOT EXISTS pgcluster_alias_state (
  alias    text        PRIMARY KEY,
  target   text        NOT NULL,
  reason   text        NOT NULL,
  moved_at timestamptz NOT NULL DEFAULT now(),
  moved_by text        NOT NULL DEFAULT '',
  term     bigint      NOT NULL DEFAULT 0
);

-- Client networks and where their clients are (topology prefer|local): of
-- networks that overlap, the longest prefix holding a client places it.
CREATE TABLE IF NOT EXISTS pgcluster_networks (
  network cidr PRIMARY KEY,
  region  text,  -- a DNS label, NULL unknown
  zone    text   -- a DNS label, NULL unknown
);

-- Drains: an operator takes a node, a whole cluster, or every node of a
-- cluster in one topology zone out of every shared name (the cluster's
-- name, its role names, its aliases, its SRV records) with a reason, until
-- a time or until the drain is deleted; a drained node keeps its own name.
-- node NULL and zone NULL drains the whole cluster; cluster, node and zone
-- match a node's as DNS does, whatever their case. A drain ends by itself
-- at "until", judged by PostgreSQL's clock. pgclusterctl drain writes
-- them, with guards; this table is what the fleet reads.
CREATE TABLE IF NOT EXISTS pgcluster_drains (
  id         bigserial   PRIMARY KEY,
  cluster    text        NOT NULL,
  node       text,                    -- one node; NULL every node (of zone, if set)
  zone       text,                    -- every node in this topology zone; NULL any
  reason     text        NOT NULL CHECK (reason <> '' AND length(reason) <= 200),
  until      timestamptz,             -- NULL: until deleted
  created_by text        NOT NULL DEFAULT current_user,
  created_at timestamptz NOT NULL DEFAULT now(),
  CONSTRAINT pgcluster_drains_node_or_zone CHECK (node IS NULL OR zone IS NULL)
);
CREATE INDEX IF NOT EXISTS pgcluster_drains_cluster ON pgcluster_drains (lower(cluster));

-- Notifications say what changed, so that a follower reads only that:
-- 'nodes:<cluster>' for each cluster whose rows changed, 'aliases:<alias>'
-- for each alias, 'networks:<network>' for each network (a follower reads
-- every network again: a client's place depends on the networks around
-- it); the table's name ('pgcluster_nodes', 'pgcluster_aliases', 'pgcluster_networks')
-- when too much changed at once or the table was truncated, which a
-- follower answers with a full reload. An UPDATE that only moves
-- heartbeats notifies nothing: followers that judge heartbeats (stale_after)
-- read their ages on a timer of their own. Identical notifications within
-- a transaction are sent once.
CREATE OR REPLACE FUNCTION pgcluster_notify_nodes() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
  changed text[];
BEGIN
  IF TG_OP = 'TRUNCATE' THEN
    PERFORM pg_notify('pgcluster_changed', 'pgcluster_nodes');
    RETURN NULL;
  ELSIF TG_OP = 'INSERT' THEN
    SELECT array_agg(DISTINCT cluster) INTO changed FROM new_rows;
  ELSIF TG_OP = 'DELETE' THEN
    SELECT array_agg(DISTINCT cluster) INTO changed FROM old_rows;
  ELSE
    SELECT array_agg(DISTINCT cluster) INTO changed FROM (
      (SELECT cluster, name, address, port, role, healthy, region, zone FROM new_rows
       EXCEPT ALL
       SELECT cluster, name, address, port, role, healthy, region, zone FROM old_rows)
      UNION ALL
      (SELECT cluster, name, address, port, role, healthy, region, zone FROM old_rows
       EXCEPT ALL
       SELECT cluster, name, address, port, role, healthy, region, zone FROM new_rows)) d;
  END IF;
  IF changed IS NULL THEN
    RETURN NULL;
  ELSIF cardinality(changed) > 100
        OR (SELECT sum(octet_length(c)) FROM unnest(changed) c) > 7000 THEN
    PERFORM pg_notify('pgcluster_changed', 'pgcluster_nodes');
  ELSE
    PERFORM pg_notify('pgcluster_changed', 'nodes:' || c) FROM unnest(changed) c;
  END IF;
  RETURN NULL;
END;
$$;

CREATE OR REPLACE FUNCTION pgcluster_notify_aliases() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
  changed text[];
BEGIN
  IF TG_OP = 'TRUNCATE' THEN
    PERFORM pg_notify('pgcluster_changed', 'pgcluster_aliases');
    RETURN NULL;
  ELSIF TG_OP = 'INSERT' THEN
    SELECT array_agg(DISTINCT alias) INTO changed FROM new_rows;
  ELSIF TG_OP = 'DELETE' THEN
    SELECT array_agg(DISTINCT alias) INTO changed FROM old_rows;
  ELSE
    SELECT array_agg(DISTINCT alias) INTO changed FROM (
      (SELECT alias, target, fallback, failover_when, failover_after, failback FROM new_rows
       EXCEPT ALL SELECT alias, target, fallback, failover_when, failover_after, failback FROM old_rows)
      UNION ALL
      (SELECT alias, target, fallback, failover_when, failover_after, failback FROM old_rows
       EXCEPT ALL SELECT alias, target, fallback, failover_when, failover_after, failback FROM new_rows)) d;
  END IF;
  IF changed IS NULL THEN
    RETURN NULL;
  ELSIF cardinality(changed) > 100
        OR (SELECT sum(octet_length(a)) FROM unnest(changed) a) > 7000 THEN
    PERFORM pg_notify('pgcluster_changed', 'pgcluster_aliases');
  ELSE
    PERFORM pg_notify('pgcluster_changed', 'aliases:' || a) FROM unnest(changed) a;
  END IF;
  RETURN NULL;
END;
$$;

CREATE OR REPLACE FUNCTION pgcluster_notify_networks() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
  changed text[];
BEGIN
  IF TG_OP = 'TRUNCATE' THEN
    PERFORM pg_notify('pgcluster_changed', 'pgcluster_networks');
    RETURN NULL;
  ELSIF TG_OP = 'INSERT' THEN
    SELECT array_agg(DISTINCT network::text) INTO changed FROM new_rows;
  ELSIF TG_OP = 'DELETE' THEN
    SELECT array_agg(DISTINCT network::text) INTO changed FROM old_rows;
  ELSE
    SELECT array_agg(DISTINCT network::text) INTO changed FROM (
      (SELECT network, region, zone FROM new_rows EXCEPT ALL SELECT network, region, zone FROM old_rows)
      UNION ALL
      (SELECT network, region, zone FROM old_rows EXCEPT ALL SELECT network, region, zone FROM new_rows)) d;
  END IF;
  IF changed IS NULL THEN
    RETURN NULL;
  ELSIF cardinality(changed) > 100 THEN
    PERFORM pg_notify('pgcluster_changed', 'pgcluster_networks');
  ELSE
    PERFORM pg_notify('pgcluster_changed', 'networks:' || n) FROM unnest(changed) n;
  END IF;
  RETURN NULL;
END;
$$;

-- A drain changes the rows its cluster's nodes are read with: it notifies
-- 'nodes:<cluster>' for every spelling of the cluster pgcluster_nodes has.
CREATE OR REPLACE FUNCTION pgcluster_notify_drains() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
  changed text[];
BEGIN
  IF TG_OP = 'TRUNCATE' THEN
    PERFORM pg_notify('pgcluster_changed', 'pgcluster_nodes');
    RETURN NULL;
  ELSIF TG_OP = 'INSERT' THEN
    SELECT array_agg(DISTINCT n.cluster) INTO changed FROM pgcluster_nodes n
      WHERE lower(n.cluster) IN (SELECT lower(cluster) FROM new_rows);
  ELSIF TG_OP = 'DELETE' THEN
    SELECT array_agg(DISTINCT n.cluster) INTO changed FROM pgcluster_nodes n
      WHERE lower(n.cluster) IN (SELECT lower(cluster) FROM old_rows);
  ELSE
    SELECT array_agg(DISTINCT n.cluster) INTO changed FROM pgcluster_nodes n
      WHERE lower(n.cluster) IN (SELECT lower(cluster) FROM new_rows
                                 UNION SELECT lower(cluster) FROM old_rows);
  END IF;
  IF changed IS NULL THEN
    RETURN NULL;
  ELSIF cardinality(changed) > 100
        OR (SELECT sum(octet_length(c)) FROM unnest(changed) c) > 7000 THEN
    PERFORM pg_notify('pgcluster_changed', 'pgcluster_nodes');
  ELSE
    PERFORM pg_notify('pgcluster_changed', 'nodes:' || c) FROM unnest(changed) c;
  END IF;
  RETURN NULL;
END;
$$;

-- A move of an alias (or its fail-back) changes where the alias points:
-- 'aliases:<alias>' for each.
CREATE OR REPLACE FUNCTION pgcluster_notify_alias_state() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
  changed text[];
BEGIN
  IF TG_OP = 'TRUNCATE' THEN
    PERFORM pg_notify('pgcluster_changed', 'pgcluster_aliases');
    RETURN NULL;
  ELSIF TG_OP = 'INSERT' THEN
    SELECT array_agg(DISTINCT alias) INTO changed FROM new_rows;
  ELSIF TG_OP = 'DELETE' THEN
    SELECT array_agg(DISTINCT alias) INTO changed FROM old_rows;
  ELSE
    SELECT array_agg(DISTINCT alias) INTO changed FROM (SELECT alias FROM new_rows UNION SELECT alias FROM old_rows) d;
  END IF;
  IF changed IS NULL THEN
    RETURN NULL;
  ELSIF cardinality(changed) > 100 THEN
    PERFORM pg_notify('pgcluster_changed', 'pgcluster_aliases');
  ELSE
    PERFORM pg_notify('pgcluster_changed', 'aliases:' || a) FROM unnest(changed) a;
  END IF;
  RETURN NULL;
END;
$$;

-- The triggers of earlier versions (one per table, whole-table payloads).
DROP TRIGGER IF EXISTS pgcluster_nodes_changed ON pgcluster_nodes;
DROP TRIGGER IF EXISTS pgcluster_aliases_changed ON pgcluster_aliases;
DROP FUNCTION IF EXISTS pgcluster_notify();

-- A trigger with transition tables has one event: four triggers per table,
-- pgcluster_<table>_inserted, _updated, _deleted and _truncated, each
-- calling the table's pgcluster_notify_<table>().
DO $$
DECLARE
  t text;
BEGIN
  FOREACH t IN ARRAY ARRAY['nodes', 'aliases', 'networks', 'drains', 'alias_state'] LOOP
    EXECUTE format('DROP TRIGGER IF EXISTS pgcluster_%1$s_inserted ON pgcluster_%1$s', t);
    EXECUTE format('CREATE TRIGGER pgcluster_%1$s_inserted AFTER INSERT ON pgcluster_%1$s
      REFERENCING NEW TABLE AS new_rows
      FOR EACH STATEMENT EXECUTE FUNCTION pgcluster_notify_%1$s()', t);
    EXECUTE format('DROP TRIGGER IF EXISTS pgcluster_%1$s_updated ON pgcluster_%1$s', t);
    EXECUTE format('CREATE TRIGGER pgcluster_%1$s_updated AFTER UPDATE ON pgcluster_%1$s
      REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
      FOR EACH STATEMENT EXECUTE FUNCTION pgcluster_notify_%1$s()', t);
    EXECUTE format('DROP TRIGGER IF EXISTS pgcluster_%1$s_deleted ON pgcluster_%1$s', t);
    EXECUTE format('CREATE TRIGGER pgcluster_%1$s_deleted AFTER DELETE ON pgcluster_%1$s
      REFERENCING OLD TABLE AS old_rows
      FOR EACH STATEMENT EXECUTE FUNCTION pgcluster_notify_%1$s()', t);
    EXECUTE format('DROP TRIGGER IF EXISTS pgcluster_%1$s_truncated ON pgcluster_%1$s', t);
    EXECUTE format('CREATE TRIGGER pgcluster_%1$s_truncated AFTER TRUNCATE ON pgcluster_%1$s
      FOR EACH STATEMENT EXECUTE FUNCTION pgcluster_notify_%1$s()', t);
  END LOOP;
END
$$;
