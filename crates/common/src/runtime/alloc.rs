//! Process start-up of every service binary: the allocator setting, then the
//! tokio runtime ([`block_on_service`] replaces `#[tokio::main]`). Why one malloc
//! arena: docs/ARCHITECTURE.md, "One shape for the three services".

/// Arenas glibc's malloc may create ([`limit_malloc_arenas`]).
pub const MALLOC_ARENAS: i32 = 1;

/// Cap glibc's malloc at [`MALLOC_ARENAS`] arenas unless the environment sets
/// the count (`MALLOC_ARENA_MAX`, `GLIBC_TUNABLES`); call first in `main`.
/// No-op on other C libraries.
pub fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if !operator_set_arenas(
        std::env::var_os("MALLOC_ARENA_MAX").is_some(),
        std::env::var("GLIBC_TUNABLES").ok().as_deref(),
    ) {
        // SAFETY: mallopt only changes a malloc tunable; M_ARENA_MAX is a
        // valid parameter on every glibc since 2.10. A zero return (refused)
        // leaves glibc's default, which is harmless.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, MALLOC_ARENAS);
        }
    }
}

/// Whether `MALLOC_ARENA_MAX` is set or `GLIBC_TUNABLES` names `glibc.malloc.arena_max`.
#[cfg_attr(not(all(target_os = "linux", target_env = "gnu")), allow(dead_code))]
fn operator_set_arenas(malloc_arena_max_set: bool, glibc_tunables: Option<&str>) -> bool {
    malloc_arena_max_set
        || glibc_tunables.is_some_and(|t| {
            t.split(':')
                .any(|pair| pair.split('=').next() == Some("glibc.malloc.arena_max"))
        })
}

/// A service's `main`: [`limit_malloc_arenas`], then `main` on a multi-thread
/// tokio runtime (as `#[tokio::main]`). Panics: the runtime cannot be built.
pub fn block_on_service<T>(main: impl std::future::Future<Output = T>) -> T {
    limit_malloc_arenas();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("failed building the tokio runtime")
        .block_on(main)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_operators_arena_setting_in_either_variable_wins() {
        assert!(!operator_set_arenas(false, None));
        assert!(operator_set_arenas(true, None));
        assert!(operator_set_arenas(
            false,
            Some("glibc.malloc.trim_threshold=1:glibc.malloc.arena_max=4")
        ));
        assert!(!operator_set_arenas(
            false,
            Some("glibc.malloc.trim_threshold=1")
        ));
    }

    #[test]
    fn block_on_service_runs_the_future_on_a_runtime_with_timers_and_io() {
        let out = block_on_service(async {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            listener.local_addr().unwrap().port() > 0
        });
        assert!(out);
    }
}
