//! The observer's label handles across a reload.

use std::sync::Arc;

use super::*;
use crate::config::{load, Overrides};

fn yaml(limit: &str) -> String {
    format!(
        "upstreams: {{ b: [\"127.0.0.1:9\"] }}\n\
         routes: [ {{ name: r, match: {{ path_prefix: / }}, upstream: b }} ]\n\
         limits: [ {{ name: {limit}, key: [client_ip], limit: 100, window: 1m }} ]\n"
    )
}

/// The address of the labels `with_labels` hands `cfg`'s requests on this thread.
fn labels_used(observer: &Observer, cfg: &Arc<Config>) -> usize {
    observer.with_labels(cfg, |l| std::ptr::from_ref(l) as usize)
}

#[tokio::test]
async fn a_thread_uses_its_last_labels_until_another_thread_replaces_them() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.yaml");
    std::fs::write(&path, yaml("first")).unwrap();
    let overrides = Overrides::default();
    let cfg = load(&path, &overrides).unwrap();
    let store = Arc::new(Store::new(&cfg.startup.store).unwrap());
    let handle = Arc::new(ConfigHandle::new(cfg, Some(path.clone()), overrides));
    let observer = Observer::new(handle.clone(), store, Shedder::leaked()).unwrap();
    let shared = || Arc::as_ptr(&observer.labels.load_full()) as usize;

    let first = handle.snapshot();
    let kept = labels_used(&observer, &first);
    assert_eq!(kept, shared());
    assert_eq!(labels_used(&observer, &first), kept, "the same again");

    std::fs::write(&path, yaml("second")).unwrap();
    handle.reload().await.unwrap();
    let second = handle.snapshot();
    // Until a request or scrape on the new config resolves its labels, the first config's stay
    // current, and this thread keeps using them.
    assert_eq!(labels_used(&observer, &first), kept);

    // Another thread (a scrape, a request on another worker) resolves the new config's labels
    // and prunes the first config's series from the registry.
    let resolved =
        std::thread::scope(|s| s.spawn(|| labels_used(&observer, &second)).join().unwrap());
    assert_eq!(resolved, shared());
    assert_ne!(resolved, kept);
    // A request still running on the first config gets labels of its own, not the pruned
    // ones this thread last used, whose counts no scrape would show.
    let own = labels_used(&observer, &first);
    assert_ne!(own, kept);
    assert_ne!(own, resolved);
    // And this thread's next request on the new config uses the shared labels.
    assert_eq!(labels_used(&observer, &second), resolved);
}
