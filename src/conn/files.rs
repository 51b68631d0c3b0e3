//! The proxy's connection cap against the open-file limit: the proxy's cap, the admin
//! listener's and a reserve must all fit in it, so that no listener can take the file
//! descriptors another one's cap promises.
//!
//! Phase: startup.

use crate::config::defaults::{MAX_CONNECTIONS_SHARE, RESERVED_FILES};

/// The proxy's cap: `configured` (`server.max_connections`), or by default 90% of the
/// open-file limit (already raised to the hard limit), but no more than what `admin_cap`
/// (`admin.max_connections`) and [`RESERVED_FILES`] leave of it. A configured cap that does
/// not fit is kept, with a warning saying what to change.
pub fn proxy_cap(configured: Option<usize>, admin_cap: usize, open_files: Option<u64>) -> usize {
    let files = usize::try_from(open_files.unwrap_or(1024)).unwrap_or(usize::MAX);
    let fits = files.saturating_sub(admin_cap.saturating_add(RESERVED_FILES));
    match configured {
        Some(cap) => {
            if cap > fits {
                tracing::warn!(
                    max_connections = cap,
                    admin_max_connections = admin_cap,
                    reserved = RESERVED_FILES,
                    open_files = files,
                    "server.max_connections, admin.max_connections and the files reserved \
                     for the gateway itself need an open-file limit of {}, above this one: \
                     raise it (ulimit -n, systemd's LimitNOFILE) or lower \
                     server.max_connections to {fits}, or the proxy fails to accept \
                     connections before its cap",
                    cap.saturating_add(admin_cap).saturating_add(RESERVED_FILES),
                );
            }
            cap
        }
        None => ((files as f64 * MAX_CONNECTIONS_SHARE) as usize)
            .min(fits)
            .max(1),
    }
}

#[cfg(test)]
mod tests {
    use super::proxy_cap;

    #[test]
    fn the_default_leaves_room_for_the_admin_cap_and_the_reserve() {
        assert_eq!(proxy_cap(None, 64, Some(4096)), 3_686, "90% of 4096");
        assert_eq!(proxy_cap(None, 64, Some(1024)), 896, "1024 - 64 - 64");
        assert_eq!(proxy_cap(None, 64, Some(256)), 128);
        assert_eq!(proxy_cap(None, 64, Some(100)), 1);
        assert_eq!(
            proxy_cap(Some(5_000), 64, Some(1024)),
            5_000,
            "kept, with a warning"
        );
    }
}
