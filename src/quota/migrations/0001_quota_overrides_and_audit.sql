-- The overrides and the audit trail. IF NOT EXISTS: a database made by the hand-written
-- runner this replaced (its table tollgate_schema at version 3) already has all of it.
CREATE TABLE IF NOT EXISTS tollgate_quota_overrides (
    key_hash     TEXT PRIMARY KEY,
    fingerprint  TEXT NOT NULL,
    label        TEXT,
    tier         TEXT,
    status       TEXT NOT NULL,
    limits       TEXT NOT NULL,
    effective_at BIGINT,
    expires_at   BIGINT,
    created_at   BIGINT NOT NULL,
    updated_at   BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS tollgate_quota_fingerprint ON tollgate_quota_overrides (fingerprint);
CREATE TABLE IF NOT EXISTS tollgate_quota_audit (
    id          TEXT PRIMARY KEY,
    at          BIGINT NOT NULL,
    fingerprint TEXT NOT NULL,
    action      TEXT NOT NULL,
    before_doc  TEXT,
    after_doc   TEXT,
    client      TEXT NOT NULL
);
