//! lanes' multipath core (sans-IO): path states, health scoring, path selectors and request
//! splitting. No sockets, no clocks, no threads: time comes in as an argument, so every rule
//! here runs the same under a virtual clock in tests as under the driver.
//!
//! `lanes attach` logs in to every portal of a target and makes one block device of all the
//! paths. The driver (tokio, in the initiator) owns the connections; this crate decides:
//!
//! - **Which path a request goes to** — [`Selector::select`], the hot path. The driver keeps
//!   per-path atomic counters, copies them into a small slice of [`PathView`]s and calls a pure
//!   function of that slice plus one atomic counter: no lock, no allocation. Policies
//!   ([`Policy`]): `service-time` (default), `queue-length`, `round-robin`,
//!   `round-robin-subset`, `weighted`, `failover`. All of them use only the best ALUA tier among
//!   the eligible paths.
//! - **How to cut a large request** — [`split()`], so that one stream of large reads at queue
//!   depth 1 keeps every path busy; aligned pieces, no allocation.
//! - **When a path is healthy, failed, demoted or back** — [`PathSet`], at the slower pace of
//!   pings and ticks, under the driver's lock. The life cycle ([`PathState`]) and its diagram
//!   are in [`state`].
//!
//! A driver's loop, in outline:
//!
//! ```
//! use std::time::{Duration, Instant};
//! use mpath::{Event, HealthConfig, PathSet, PathView, Policy, Selector};
//!
//! let policy: Policy = "round-robin".parse().unwrap();
//! let selector = Selector::new(policy.clone());
//! let mut paths = PathSet::with_policy(HealthConfig::default(), &policy);
//! let t0 = Instant::now();
//! let a = paths.add("192.168.1.10:3260".into(), 1, 0, t0);
//! let b = paths.add("192.168.2.10:3260".into(), 1, 0, t0);
//! paths.logged_in(a, t0); // first logins: Active at once
//! paths.logged_in(b, t0);
//!
//! // Timers: sleep until poll_timeout, then handle_timeout, then drain the events.
//! let now = paths.poll_timeout().unwrap(); // first pings, 250 ms on
//! paths.handle_timeout(now);
//! while let Some(event) = paths.poll_event() {
//!     match event {
//!         Event::SendPing(id) => { /* send a NOP-Out; later: */ paths.ping_answered(id, Duration::from_millis(1), now) }
//!         Event::Fail { .. } => { /* abortive close, fence, replay in-flight commands elsewhere */ }
//!         Event::Reconnect(_) => { /* log in again: logged_in or login_failed */ }
//!         Event::StateChanged { path, from, to, reason } => println!("{path}: {from} -> {to}: {reason}"),
//!     }
//! }
//!
//! // Per request: views from the atomics (eligible and tier from the PathSet), then select.
//! let views: Vec<PathView> = paths
//!     .ids()
//!     .map(|id| PathView { eligible: paths.eligible(id), tier: paths.tier(id), weight: 1, ..PathView::default() })
//!     .collect();
//! let first = selector.select(&views, 65536).unwrap();
//! let second = selector.select(&views, 65536).unwrap();
//! assert_ne!(first, second);
//!
//! // A 1 MiB read cut for two paths: two aligned 512 KiB pieces.
//! let pieces: Vec<_> = mpath::split(0, 1 << 20, 2, 4096, 256 << 10, 64 << 10).collect();
//! assert_eq!(pieces, [(0, 512 << 10), (512 << 10, 512 << 10)]);
//! ```
#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::indexing_slicing))]

pub mod health;
pub mod path;
pub mod pathset;
pub mod policy;
pub mod select;
pub mod split;
pub mod state;

pub use health::{Event, HealthConfig, PathSample};
pub use path::{tier_name, PathId, PathView, TIER_NON_OPTIMIZED, TIER_NO_IO, TIER_OPTIMIZED};
pub use pathset::{PathSet, HISTORY_LEN};
pub use policy::{Failback, ParseError, Policy};
pub use select::Selector;
pub use split::{split, Pieces};
pub use state::PathState;
