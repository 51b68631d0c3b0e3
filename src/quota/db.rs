//! Where overrides and the audit trail are kept: PostgreSQL, or an embedded SQLite file. One
//! schema and one set of queries for both, through sqlx's `Any` driver (`$1` markers work on
//! both; times are Unix seconds as integers, and documents are JSON text, so nothing depends on
//! a dialect's types). Migrations (`migrations/`) are applied at start by sqlx's `Migrator`.
//!
//! Phase: the admin API and the refresh task, never a request.

use std::time::Duration;

use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::{AnyPool, Row, SqlSafeStr};

use super::model::{AuditEntry, KeyHash, Override, Status};

/// The schema's migrations, in order, embedded in the binary. sqlx's `Migrator` applies each
/// at most once, under the database's lock (PostgreSQL's advisory lock), and refuses to start
/// if an applied one has since changed (its checksum, kept in `_sqlx_migrations`). A new step
/// is a new file with the next number; an applied file never changes.
fn migrator() -> Migrator {
    let step = |version, description: &'static str, sql: &'static str| {
        Migration::new(
            version,
            description.into(),
            MigrationType::Simple,
            sql.into_sql_str(),
            false,
        )
    };
    Migrator::with_migrations(vec![step(
        1,
        "quota overrides and audit",
        include_str!("migrations/0001_quota_overrides_and_audit.sql"),
    )])
}

/// The database could not answer.
#[derive(Debug, thiserror::Error)]
#[error("quota database: {0}")]
pub struct DbError(#[from] pub sqlx::Error);

/// A connection pool to the quota database.
#[derive(Debug, Clone)]
pub struct Db {
    pool: AnyPool,
    postgres: bool,
}

/// The columns of an override row, in [`override_of`]'s order (a macro, so that every
/// statement stays a `&'static str`).
macro_rules! columns {
    () => {
        "key_hash, fingerprint, label, tier, status, limits, effective_at, expires_at, created_at, updated_at"
    };
}

/// The PostgreSQL channel every gateway listens on for override changes.
macro_rules! channel {
    () => {
        "tollgate_quota_changes"
    };
}

impl Db {
    /// Connect to `url` (`postgres://…` or `sqlite://PATH`, created if missing) and apply the
    /// migrations.
    pub async fn connect(url: &str, timeout: Duration) -> Result<Db, DbError> {
        sqlx::any::install_default_drivers();
        let postgres = url.starts_with("postgres");
        let url = if url.starts_with("sqlite:") && !url.contains("mode=") {
            format!("{url}{}mode=rwc", if url.contains('?') { '&' } else { '?' })
        } else {
            url.to_string()
        };
        let pool = AnyPoolOptions::new()
            .max_connections(if postgres { 4 } else { 1 })
            .acquire_timeout(timeout)
            .connect(&url)
            .await?;
        let db = Db { pool, postgres };
        db.migrate().await?;
        Ok(db)
    }

    /// PostgreSQL (other gateways can be told of changes), or SQLite.
    pub fn is_postgres(&self) -> bool {
        self.postgres
    }

    async fn migrate(&self) -> Result<(), DbError> {
        migrator()
            .run(&self.pool)
            .await
            .map_err(|e| DbError(e.into()))
    }

    /// Every override (for the in-memory table).
    pub async fn all(&self) -> Result<Vec<Override>, DbError> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            columns!(),
            " FROM tollgate_quota_overrides"
        ))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(override_of).collect()
    }

    /// The override of one key.
    pub async fn get(&self, key: &KeyHash) -> Result<Option<Override>, DbError> {
        let row = sqlx::query(concat!(
            "SELECT ",
            columns!(),
            " FROM tollgate_quota_overrides WHERE key_hash = $1"
        ))
        .bind(key.hex())
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(override_of).transpose()
    }

    /// The key hashes whose fingerprint is `fp` (8 hex digits).
    pub async fn by_fingerprint(&self, fp: &str) -> Result<Vec<KeyHash>, DbError> {
        let rows =
            sqlx::query("SELECT key_hash FROM tollgate_quota_overrides WHERE fingerprint = $1")
                .bind(fp)
                .fetch_all(&self.pool)
                .await?;
        Ok(rows
            .iter()
            .filter_map(|r| r.try_get::<String, _>(0).ok())
            .filter_map(|h| KeyHash::from_hex(&h))
            .collect())
    }

    /// A page of overrides by fingerprint, after `cursor` (a fingerprint and key hash).
    pub async fn list(&self, limit: i64, cursor: Option<&str>) -> Result<Vec<Override>, DbError> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            columns!(),
            " FROM tollgate_quota_overrides
             WHERE (fingerprint || ':' || key_hash) > $1
             ORDER BY fingerprint, key_hash LIMIT $2"
        ))
        .bind(cursor.unwrap_or(""))
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(override_of).collect()
    }

    /// Write `o` (insert or replace) and its audit entry, in one transaction.
    pub async fn put(&self, o: &Override, audit: &AuditEntry) -> Result<(), DbError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("DELETE FROM tollgate_quota_overrides WHERE key_hash = $1")
            .bind(o.key_hash.hex())
            .execute(&mut *tx)
            .await?;
        sqlx::query(concat!(
            "INSERT INTO tollgate_quota_overrides (",
            columns!(),
            ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"
        ))
        .bind(o.key_hash.hex())
        .bind(o.fingerprint.clone())
        .bind(o.label.clone())
        .bind(o.tier.clone())
        .bind(o.status.as_str())
        .bind(serde_json::to_string(&o.limits).expect("JSON"))
        .bind(o.effective_at)
        .bind(o.expires_at)
        .bind(o.created_at)
        .bind(o.updated_at)
        .execute(&mut *tx)
        .await?;
        insert_audit(&mut tx, audit).await?;
        tx.commit().await?;
        self.notify().await;
        Ok(())
    }

    /// Remove the override of `key` with its audit entry; whether there was one.
    pub async fn delete(&self, key: &KeyHash, audit: &AuditEntry) -> Result<bool, DbError> {
        let mut tx = self.pool.begin().await?;
        let done = sqlx::query("DELETE FROM tollgate_quota_overrides WHERE key_hash = $1")
            .bind(key.hex())
            .execute(&mut *tx)
            .await?;
        insert_audit(&mut tx, audit).await?;
        tx.commit().await?;
        self.notify().await;
        Ok(done.rows_affected() > 0)
    }

    /// Append an audit entry on its own (a usage reset).
    pub async fn audit(&self, entry: &AuditEntry) -> Result<(), DbError> {
        let mut tx = self.pool.begin().await?;
        insert_audit(&mut tx, entry).await?;
        tx.commit().await?;
        Ok(())
    }

    /// A page of the audit trail, newest first, before `cursor` (an entry id).
    pub async fn audit_page(
        &self,
        limit: i64,
        cursor: Option<&str>,
    ) -> Result<Vec<AuditEntry>, DbError> {
        let rows = sqlx::query(
            "SELECT id, at, fingerprint, action, before_doc, after_doc, client FROM tollgate_quota_audit
             WHERE id < $1 ORDER BY id DESC LIMIT $2",
        )
        .bind(cursor.unwrap_or("~"))
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(AuditEntry {
                    id: r.try_get(0)?,
                    at: r.try_get(1)?,
                    fingerprint: r.try_get(2)?,
                    action: r.try_get(3)?,
                    before: r.try_get(4)?,
                    after: r.try_get(5)?,
                    client: r.try_get(6)?,
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(DbError)
    }

    /// Whether the database answers.
    pub async fn ping(&self) -> bool {
        sqlx::query("SELECT 1").execute(&self.pool).await.is_ok()
    }

    /// Tell every gateway listening (PostgreSQL) that the overrides changed.
    async fn notify(&self) {
        if self.postgres {
            let sent = sqlx::query(concat!("NOTIFY ", channel!()))
                .execute(&self.pool)
                .await;
            if let Err(e) = sent {
                tracing::warn!(
                    "quota change not announced ({e}); gateways see it at their next refresh"
                );
            }
        }
    }
}

/// The PostgreSQL channel every gateway listens on for override changes.
pub const CHANNEL: &str = channel!();

async fn insert_audit(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    e: &AuditEntry,
) -> Result<(), DbError> {
    sqlx::query(
        "INSERT INTO tollgate_quota_audit (id, at, fingerprint, action, before_doc, after_doc, client)
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
    )
    .bind(e.id.clone())
    .bind(e.at)
    .bind(e.fingerprint.clone())
    .bind(e.action.clone())
    .bind(e.before.clone())
    .bind(e.after.clone())
    .bind(e.client.clone())
    .execute(&mut **tx)
    .await?;
    Ok(())
}

fn override_of(r: &AnyRow) -> Result<Override, DbError> {
    let hash: String = r.try_get(0)?;
    let status: String = r.try_get(4)?;
    let limits: String = r.try_get(5)?;
    Ok(Override {
        key_hash: KeyHash::from_hex(&hash).ok_or_else(|| bad(format!("key_hash {hash:?}")))?,
        fingerprint: r.try_get(1)?,
        label: r.try_get(2)?,
        tier: r.try_get(3)?,
        status: Status::parse(&status).ok_or_else(|| bad(format!("status {status:?}")))?,
        limits: serde_json::from_str(&limits).map_err(|e| bad(format!("limits: {e}")))?,
        effective_at: r.try_get(6)?,
        expires_at: r.try_get(7)?,
        created_at: r.try_get(8)?,
        updated_at: r.try_get(9)?,
    })
}

fn bad(what: String) -> DbError {
    DbError(sqlx::Error::Protocol(format!(
        "unreadable override row: {what}"
    )))
}
