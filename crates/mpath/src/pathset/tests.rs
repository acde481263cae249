//! PathSet on a virtual clock: pings and misses, timeouts, demotion, reconnects, failback, the
//! round-robin subset, and the event/history bookkeeping.

use super::*;
use crate::path::TIER_NON_OPTIMIZED;
use proptest::prelude::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn drain(set: &mut PathSet) -> Vec<Event> {
    std::iter::from_fn(|| set.poll_event()).collect()
}

/// Runs the timers from `from` up to `until` (inclusive), answering the pings of paths for
/// which `alive` says so, and returns every event with the time it came out.
fn run(
    set: &mut PathSet,
    from: Instant,
    until: Instant,
    alive: impl Fn(PathId) -> bool,
) -> Vec<(Instant, Event)> {
    let mut out = Vec::new();
    let mut now = from;
    loop {
        while let Some(e) = set.poll_event() {
            if let Event::SendPing(id) = e {
                set.ping_sent(id, now);
                if alive(id) {
                    set.ping_answered(id, ms(1), now);
                }
            }
            out.push((now, e));
        }
        match set.poll_timeout() {
            Some(t) if t <= until => {
                // A deadline before `from` is one the test skipped over: run it late.
                now = now.max(t);
                set.handle_timeout(now);
            }
            _ => return out,
        }
    }
}

fn changes(events: &[(Instant, Event)], path: PathId) -> Vec<(&'static str, &'static str, String)> {
    events
        .iter()
        .filter_map(|(_, e)| match e {
            Event::StateChanged {
                path: p,
                from,
                to,
                reason,
            } if *p == path => Some((*from, *to, reason.clone())),
            _ => None,
        })
        .collect()
}

fn fails(events: &[(Instant, Event)]) -> Vec<(Instant, PathId, String)> {
    events
        .iter()
        .filter_map(|(t, e)| match e {
            Event::Fail { path, reason } => Some((*t, *path, reason.clone())),
            _ => None,
        })
        .collect()
}

/// A set with `n` paths, all logged in (Active) at `t0`, events drained.
fn active_set(
    config: HealthConfig,
    policy: &Policy,
    priorities: &[u32],
    t0: Instant,
) -> (PathSet, Vec<PathId>) {
    let mut set = PathSet::with_policy(config, policy);
    let ids: Vec<_> = priorities
        .iter()
        .enumerate()
        .map(|(i, &prio)| set.add(format!("10.0.{i}.1:3260"), 1, prio, t0))
        .collect();
    for &id in &ids {
        set.logged_in(id, t0);
    }
    drain(&mut set);
    (set, ids)
}

fn slow_sample(p50: Duration) -> PathSample {
    PathSample {
        completed: 10,
        bytes: 10 << 16,
        latency_p50: p50,
        latency_p99: p50 * 2,
        ..PathSample::default()
    }
}

#[test]
fn first_login_goes_straight_to_active() {
    let t0 = Instant::now();
    let mut set = PathSet::new(HealthConfig::default());
    let a = set.add("a".into(), 1, 0, t0);
    assert_eq!(set.state(a), Some(&PathState::Connecting));
    assert!(!set.eligible(a));
    assert_eq!(set.poll_timeout(), None, "nothing to do while connecting");
    set.logged_in(a, t0 + ms(5));
    assert_eq!(set.state(a), Some(&PathState::Active { since: t0 + ms(5) }));
    assert!(set.eligible(a));
    assert_eq!(
        drain(&mut set),
        [Event::StateChanged {
            path: a,
            from: "connecting",
            to: "active",
            reason: "logged in".into()
        }]
    );
    assert_eq!(set.poll_timeout(), Some(t0 + ms(255)));
    set.handle_timeout(t0 + ms(255));
    assert_eq!(drain(&mut set), [Event::SendPing(a)]);
    assert_eq!(set.name(a), "a");
    assert_eq!(set.history(a).len(), 2);
}

#[test]
fn black_holed_path_fails_within_one_second_of_first_lost_ping() {
    let t0 = Instant::now();
    let (mut set, ids) = active_set(HealthConfig::default(), &Policy::ServiceTime, &[0, 0], t0);
    let (a, b) = (ids[0], ids[1]);
    // Healthy for 2 s.
    let events = run(&mut set, t0, t0 + ms(2000), |_| true);
    assert!(fails(&events).is_empty());
    let pings = events
        .iter()
        .filter(|(_, e)| *e == Event::SendPing(a))
        .count();
    assert_eq!(pings, 8, "one ping per 250 ms");
    // Then path a stops answering.
    let events = run(&mut set, t0 + ms(2000), t0 + ms(4000), |id| id != a);
    let first_lost = events
        .iter()
        .find(|(_, e)| *e == Event::SendPing(a))
        .map(|(t, _)| *t)
        .unwrap();
    let fails = fails(&events);
    assert_eq!(fails.len(), 1, "{fails:?}");
    let (failed_at, path, reason) = &fails[0];
    assert_eq!(*path, a);
    assert!(reason.starts_with("no answer for"), "{reason}");
    // Three ping intervals of silence, counted from the last answer (before the first lost
    // ping), so at most 750 ms after the first lost ping.
    assert!(
        *failed_at - first_lost <= ms(750),
        "failed {:?} after the first lost ping",
        *failed_at - first_lost
    );
    let ch = changes(&events, a);
    assert_eq!(ch.len(), 1, "{ch:?}");
    assert_eq!((ch[0].0, ch[0].1), ("active", "failed"));
    assert!(matches!(set.state(a), Some(PathState::Failed { .. })));
    assert!(!set.eligible(a));
    assert!(set.eligible(b), "the healthy path is untouched");
    assert!(
        !events
            .iter()
            .any(|(t, e)| *t > *failed_at && *e == Event::SendPing(a)),
        "a failed path is not pinged"
    );
}

#[test]
fn answered_ping_resets_misses() {
    let t0 = Instant::now();
    let (mut set, ids) = active_set(HealthConfig::default(), &Policy::ServiceTime, &[0], t0);
    let a = ids[0];
    // A miss, then an answer, again and again: never three intervals of silence.
    let mut now = t0;
    for round in 0..6 {
        for _ in 0..2 {
            now = set.poll_timeout().unwrap();
            set.handle_timeout(now);
            assert!(
                drain(&mut set).contains(&Event::SendPing(a)),
                "round {round}"
            );
        }
        set.ping_answered(a, ms(2), now + ms(10));
    }
    assert!(matches!(set.state(a), Some(PathState::Active { .. })));
    // Completed commands count as contact too: a path busy with I/O whose pings are slow is
    // not failed.
    let t = now + ms(10);
    set.handle_timeout(t);
    drain(&mut set);
    for k in 1..=8u64 {
        set.contact(a, t + ms(200 * k));
        set.handle_timeout(t + ms(200 * k));
        drain(&mut set);
    }
    assert!(matches!(set.state(a), Some(PathState::Active { .. })));
    // Silence after that fails it, three intervals after the last contact.
    let last = t + ms(1600);
    let deadline = set.poll_timeout().unwrap();
    assert!(deadline <= last + ms(750), "{:?}", deadline - last);
    let mut at = deadline;
    while matches!(set.state(a), Some(PathState::Active { .. })) {
        set.handle_timeout(at);
        at = set.poll_timeout().unwrap_or(at + ms(250));
    }
    assert!(matches!(set.state(a), Some(PathState::Failed { .. })));
    assert_eq!(set.rtt(a), Some(ms(2)));
}

#[test]
fn command_timeout_fails_the_path() {
    let t0 = Instant::now();
    let (mut set, ids) = active_set(HealthConfig::default(), &Policy::ServiceTime, &[0, 0], t0);
    let a = ids[0];
    let stuck = |age| PathSample {
        oldest_inflight: Some(age),
        ..PathSample::default()
    };
    set.sample(a, stuck(ms(4900)), t0 + ms(5000));
    assert!(drain(&mut set).is_empty());
    set.sample(a, stuck(ms(5100)), t0 + ms(5200));
    let events = drain(&mut set);
    let reason = "command outstanding 5.1 s (timeout 5 s)".to_string();
    assert_eq!(
        events,
        [
            Event::Fail {
                path: a,
                reason: reason.clone()
            },
            Event::StateChanged {
                path: a,
                from: "active",
                to: "failed",
                reason
            },
        ]
    );
}

#[test]
fn failed_path_reconnects_then_probes_back_to_active() {
    let t0 = Instant::now();
    let (mut set, ids) = active_set(HealthConfig::default(), &Policy::ServiceTime, &[0, 0], t0);
    let a = ids[0];
    set.connection_lost(a, "reset by peer".into(), t0 + ms(100));
    assert_eq!(
        drain(&mut set),
        [
            Event::Fail {
                path: a,
                reason: "connection lost: reset by peer".into()
            },
            Event::StateChanged {
                path: a,
                from: "active",
                to: "failed",
                reason: "connection lost: reset by peer".into()
            },
        ]
    );
    // A second report of the same loss changes nothing.
    set.connection_lost(a, "again".into(), t0 + ms(101));
    assert!(drain(&mut set).is_empty());
    // Reconnect every 500 ms while failed.
    let events = run(&mut set, t0 + ms(100), t0 + ms(1700), |_| true);
    let reconnects: Vec<_> = events
        .iter()
        .filter(|(_, e)| *e == Event::Reconnect(a))
        .map(|(t, _)| *t - t0)
        .collect();
    assert_eq!(reconnects, [ms(600), ms(1100), ms(1600)]);
    // A failed login pushes the next attempt a full interval out and updates the reason.
    set.login_failed(a, "connection refused".into(), t0 + ms(1800));
    assert!(drain(&mut set).is_empty(), "no state change");
    assert!(
        matches!(set.state(a), Some(PathState::Failed { reason, .. }) if reason == "login failed: connection refused")
    );
    let events = run(&mut set, t0 + ms(1800), t0 + ms(2300), |_| true);
    let reconnects: Vec<_> = events
        .iter()
        .filter(|(_, e)| *e == Event::Reconnect(a))
        .map(|(t, _)| *t - t0)
        .collect();
    assert_eq!(reconnects, [ms(2300)]);
    // Logged in again: probing, pinged at once, Active after 2 answered pings.
    set.logged_in(a, t0 + ms(2400));
    assert!(matches!(
        set.state(a),
        Some(PathState::Probing { good: 0, .. })
    ));
    assert!(!set.eligible(a));
    assert!(
        set.poll_timeout() <= Some(t0 + ms(2400)),
        "first probe ping is due at once"
    );
    assert_eq!(
        drain(&mut set),
        [Event::StateChanged {
            path: a,
            from: "failed",
            to: "probing",
            reason: "logged in, probing".into()
        }]
    );
    let events = run(&mut set, t0 + ms(2400), t0 + ms(3000), |_| true);
    assert_eq!(
        changes(&events, a),
        [("probing", "active", "probe ok".to_string())],
        "{events:?}"
    );
    let active_at = match set.state(a) {
        Some(PathState::Active { since }) => *since,
        s => panic!("{s:?}"),
    };
    assert_eq!(
        active_at,
        t0 + ms(2650),
        "second probe ping, one interval after the first"
    );
    assert!(set.eligible(a));
    assert!(!events
        .iter()
        .any(|(t, e)| *t > t0 + ms(2400) && *e == Event::Reconnect(a)));
    let states: Vec<_> = set.history(a).iter().map(|(_, s, _)| *s).collect();
    assert_eq!(
        states,
        ["connecting", "active", "failed", "probing", "active"]
    );
}

#[test]
fn first_login_failure_is_failed_without_fail_event() {
    let t0 = Instant::now();
    let mut set = PathSet::new(HealthConfig::default());
    let a = set.add("a".into(), 1, 0, t0);
    set.login_failed(a, "no route to host".into(), t0 + ms(3));
    assert_eq!(
        drain(&mut set),
        [Event::StateChanged {
            path: a,
            from: "connecting",
            to: "failed",
            reason: "login failed: no route to host".into()
        }]
    );
    assert_eq!(set.poll_timeout(), Some(t0 + ms(503)));
}

#[test]
fn slow_path_is_demoted_after_two_samples_and_reprobed() {
    let t0 = Instant::now();
    let (mut set, ids) = active_set(HealthConfig::default(), &Policy::ServiceTime, &[0, 0], t0);
    let (a, b) = (ids[0], ids[1]);
    set.sample(a, slow_sample(ms(3)), t0 + ms(100));
    set.sample(b, slow_sample(ms(120)), t0 + ms(100));
    assert!(drain(&mut set).is_empty(), "one slow sample is not enough");
    set.sample(a, slow_sample(ms(3)), t0 + ms(200));
    set.sample(b, slow_sample(ms(120)), t0 + ms(200));
    let reason = "latency 120 ms vs 3 ms on path0".to_string();
    assert_eq!(
        drain(&mut set),
        [Event::StateChanged {
            path: b,
            from: "active",
            to: "demoted",
            reason: reason.clone()
        }]
    );
    assert_eq!(
        set.state(b),
        Some(&PathState::Demoted {
            since: t0 + ms(200),
            reason
        })
    );
    assert!(!set.eligible(b));
    // Still pinged while demoted, and probed again after demote_for (5 s).
    let events = run(&mut set, t0 + ms(200), t0 + ms(5200), |_| true);
    assert!(
        events
            .iter()
            .filter(|(_, e)| *e == Event::SendPing(b))
            .count()
            >= 19
    );
    assert_eq!(
        changes(&events, b),
        [("demoted", "probing", "demotion over, probing".to_string())]
    );
    let events = run(&mut set, t0 + ms(5200), t0 + ms(5800), |_| true);
    assert_eq!(
        changes(&events, b),
        [("probing", "active", "probe ok".to_string())]
    );
    assert!(set.eligible(b));
}

#[test]
fn latency_needs_both_factor_and_floor_in_a_row() {
    let t0 = Instant::now();
    let (mut set, ids) = active_set(HealthConfig::default(), &Policy::ServiceTime, &[0, 0], t0);
    let (a, b) = (ids[0], ids[1]);
    for k in 1..10 {
        // 15 ms is 15x the other path but under the 20 ms floor.
        set.sample(a, slow_sample(ms(1)), t0 + ms(100 * k));
        set.sample(b, slow_sample(ms(15)), t0 + ms(100 * k));
    }
    // 100 ms vs 20 ms: over the floor, only 5x.
    set.sample(a, slow_sample(ms(20)), t0 + ms(1000));
    set.sample(b, slow_sample(ms(100)), t0 + ms(1000));
    set.sample(b, slow_sample(ms(100)), t0 + ms(1100));
    // Slow, fast, slow: not consecutive.
    set.sample(a, slow_sample(ms(2)), t0 + ms(1200));
    set.sample(b, slow_sample(ms(100)), t0 + ms(1200));
    set.sample(b, slow_sample(ms(3)), t0 + ms(1300));
    set.sample(b, slow_sample(ms(100)), t0 + ms(1400));
    assert!(drain(&mut set).is_empty());
    assert!(set.eligible(b));
    // An idle sample (no completions) neither counts nor resets.
    set.sample(b, PathSample::default(), t0 + ms(1500));
    set.sample(b, slow_sample(ms(100)), t0 + ms(1600));
    assert!(matches!(set.state(b), Some(PathState::Demoted { .. })));
}

#[test]
fn errors_in_one_sample_demote() {
    let t0 = Instant::now();
    let (mut set, ids) = active_set(HealthConfig::default(), &Policy::ServiceTime, &[0, 0], t0);
    let b = ids[1];
    set.sample(
        b,
        PathSample {
            errors: 4,
            ..PathSample::default()
        },
        t0 + ms(100),
    );
    assert!(set.eligible(b));
    set.sample(
        b,
        PathSample {
            errors: 5,
            ..PathSample::default()
        },
        t0 + ms(200),
    );
    assert_eq!(
        drain(&mut set),
        [Event::StateChanged {
            path: b,
            from: "active",
            to: "demoted",
            reason: "5 errors in one sample (threshold 5)".into()
        }]
    );
}

#[test]
fn last_usable_path_is_never_demoted() {
    let t0 = Instant::now();
    let (mut set, ids) = active_set(HealthConfig::default(), &Policy::ServiceTime, &[0, 0], t0);
    let (a, b) = (ids[0], ids[1]);
    set.sample(
        b,
        PathSample {
            errors: 50,
            ..PathSample::default()
        },
        t0 + ms(100),
    );
    assert!(matches!(set.state(b), Some(PathState::Demoted { .. })));
    set.sample(
        a,
        PathSample {
            errors: 50,
            ..PathSample::default()
        },
        t0 + ms(200),
    );
    assert!(set.eligible(a), "a slow path beats no path");
    // Latency too: a single path has nothing to compare with, and b (demoted) does not count.
    set.sample(a, slow_sample(ms(900)), t0 + ms(300));
    set.sample(a, slow_sample(ms(900)), t0 + ms(400));
    assert!(set.eligible(a));
}

#[test]
fn demoted_path_is_rescued_when_the_last_active_one_fails() {
    let t0 = Instant::now();
    let (mut set, ids) = active_set(HealthConfig::default(), &Policy::ServiceTime, &[0, 0], t0);
    let (a, b) = (ids[0], ids[1]);
    set.sample(
        b,
        PathSample {
            errors: 9,
            ..PathSample::default()
        },
        t0 + ms(100),
    );
    drain(&mut set);
    set.connection_lost(a, "eof".into(), t0 + ms(200));
    let events: Vec<_> = drain(&mut set).into_iter().map(|e| (t0, e)).collect();
    assert_eq!(
        changes(&events, b),
        [("demoted", "active", "no other path usable".to_string())]
    );
    assert!(set.eligible(b));
    // And a re-login with no other usable path skips the probe.
    set.connection_lost(b, "eof".into(), t0 + ms(300));
    set.logged_in(a, t0 + ms(900));
    assert!(set.eligible(a));
    let states: Vec<_> = set.history(a).iter().map(|(_, s, _)| *s).collect();
    assert_eq!(
        states,
        ["connecting", "active", "failed", "probing", "active"]
    );
}

/// Failover with paths a (priority 10) and b (priority 1): a fails and recovers.
fn failover_recovery(failback: Failback) -> (PathSet, PathId, PathId, Instant, Instant) {
    let t0 = Instant::now();
    let config = HealthConfig {
        failback,
        ..HealthConfig::default()
    };
    let (mut set, ids) = active_set(config, &Policy::Failover, &[10, 1], t0);
    let (a, b) = (ids[0], ids[1]);
    set.connection_lost(a, "eof".into(), t0 + ms(10));
    set.logged_in(a, t0 + ms(600));
    set.ping_answered(a, ms(1), t0 + ms(601));
    set.ping_answered(a, ms(1), t0 + ms(851));
    drain(&mut set);
    (set, a, b, t0, t0 + ms(851))
}

#[test]
fn failover_immediate_failback() {
    let (set, a, b, _, ready) = failover_recovery(Failback::Immediate);
    assert_eq!(set.state(a), Some(&PathState::Active { since: ready }));
    assert!(set.eligible(a) && set.eligible(b));
    assert!(!set.failback_pending(a));
}

#[test]
fn failover_manual_failback() {
    let (mut set, a, b, _, _) = failover_recovery(Failback::Manual);
    assert!(matches!(
        set.state(a),
        Some(PathState::Probing { good: 2, .. })
    ));
    assert!(set.failback_pending(a));
    assert!(!set.eligible(a) && set.eligible(b));
    // More pings do not release it, nor does time.
    set.ping_answered(a, ms(1), Instant::now() + ms(60_000));
    set.handle_timeout(Instant::now() + ms(60_000));
    assert!(!set.eligible(a));
    drain(&mut set);
    set.failback_now();
    assert!(set.eligible(a));
    let events = drain(&mut set);
    assert!(
        matches!(&events[..], [Event::StateChanged { path, from: "probing", to: "active", reason }] if *path == a && reason == "manual failback"),
        "{events:?}"
    );
}

#[test]
fn failover_delayed_failback() {
    let (mut set, a, _, _, ready) = failover_recovery(Failback::After(Duration::from_secs(10)));
    assert!(set.failback_pending(a));
    let events = run(&mut set, ready, ready + ms(9999), |_| true);
    assert!(changes(&events, a).is_empty());
    let events = run(&mut set, ready + ms(9999), ready + ms(10_000), |_| true);
    assert_eq!(
        changes(&events, a),
        [("probing", "active", "failback after 10 s".to_string())]
    );
    assert_eq!(
        set.state(a),
        Some(&PathState::Active {
            since: ready + ms(10_000)
        })
    );
}

#[test]
fn held_path_takes_over_when_the_current_one_fails() {
    let (mut set, a, b, _, ready) = failover_recovery(Failback::Manual);
    set.connection_lost(b, "eof".into(), ready + ms(100));
    let events: Vec<_> = drain(&mut set).into_iter().map(|e| (ready, e)).collect();
    assert_eq!(
        changes(&events, a),
        [(
            "probing",
            "active",
            "failback: path1 no longer active".to_string()
        )]
    );
    assert!(set.eligible(a));
}

#[test]
fn lower_priority_recovery_is_not_held() {
    let t0 = Instant::now();
    let config = HealthConfig {
        failback: Failback::Manual,
        ..HealthConfig::default()
    };
    let (mut set, ids) = active_set(config, &Policy::Failover, &[10, 1], t0);
    let b = ids[1];
    set.connection_lost(b, "eof".into(), t0);
    set.logged_in(b, t0 + ms(600));
    set.ping_answered(b, ms(1), t0 + ms(601));
    set.ping_answered(b, ms(1), t0 + ms(602));
    assert!(
        set.eligible(b),
        "it would not take over, so no failback to wait for"
    );
}

#[test]
fn failback_gate_is_for_failover_only() {
    let t0 = Instant::now();
    let config = HealthConfig {
        failback: Failback::Manual,
        ..HealthConfig::default()
    };
    let (mut set, ids) = active_set(config, &Policy::RoundRobin, &[10, 1], t0);
    let a = ids[0];
    set.connection_lost(a, "eof".into(), t0);
    set.logged_in(a, t0 + ms(600));
    set.ping_answered(a, ms(1), t0 + ms(601));
    set.ping_answered(a, ms(1), t0 + ms(602));
    assert!(set.eligible(a));
}

#[test]
fn round_robin_subset_promotes_standby() {
    let t0 = Instant::now();
    let (mut set, ids) = active_set(
        HealthConfig::default(),
        &Policy::RoundRobinSubset { active: 2 },
        &[0; 4],
        t0,
    );
    let eligible = |set: &PathSet| ids.iter().map(|&id| set.eligible(id)).collect::<Vec<_>>();
    assert_eq!(eligible(&set), [true, true, false, false]);
    set.connection_lost(ids[0], "eof".into(), t0);
    assert_eq!(eligible(&set), [false, true, true, false]);
    set.set_alua(ids[1], TIER_NO_IO, t0);
    assert_eq!(eligible(&set), [false, false, true, true]);
    set.set_alua(ids[1], TIER_OPTIMIZED, t0);
    set.logged_in(ids[0], t0 + ms(600));
    set.ping_answered(ids[0], ms(1), t0 + ms(601));
    set.ping_answered(ids[0], ms(1), t0 + ms(602));
    assert_eq!(eligible(&set), [true, true, false, false]);
}

#[test]
fn alua_change_is_logged_and_no_io_tier_is_not_eligible() {
    let t0 = Instant::now();
    let (mut set, ids) = active_set(HealthConfig::default(), &Policy::ServiceTime, &[0, 0], t0);
    let a = ids[0];
    let generation = set.generation();
    set.set_alua(a, TIER_OPTIMIZED, t0);
    assert!(drain(&mut set).is_empty(), "no change, no event");
    assert_eq!(set.generation(), generation);
    set.set_alua(a, TIER_NON_OPTIMIZED, t0 + ms(1));
    assert_eq!(
        drain(&mut set),
        [Event::StateChanged {
            path: a,
            from: "active",
            to: "active",
            reason: "ALUA active/optimized -> active/non-optimized".into()
        }]
    );
    assert!(set.eligible(a));
    assert_ne!(set.generation(), generation);
    set.set_alua(a, 3, t0 + ms(2));
    assert_eq!(set.tier(a), 3);
    assert!(!set.eligible(a));
}

#[test]
fn removed_path_is_gone() {
    let t0 = Instant::now();
    let (mut set, ids) = active_set(HealthConfig::default(), &Policy::ServiceTime, &[0, 0], t0);
    set.remove(ids[0], t0 + ms(1));
    assert_eq!(set.state(ids[0]), Some(&PathState::Removed));
    assert_eq!(set.ids().collect::<Vec<_>>(), [ids[1]]);
    let events = run(&mut set, t0, t0 + ms(2000), |_| true);
    assert!(!events.iter().any(|(_, e)| *e == Event::SendPing(ids[0])));
    // Unknown ids are ignored, never a panic.
    let ghost = PathId(99);
    set.logged_in(ghost, t0);
    set.ping_answered(ghost, ms(1), t0);
    set.sample(ghost, PathSample::default(), t0);
    set.connection_lost(ghost, "x".into(), t0);
    assert_eq!(
        (set.state(ghost), set.name(ghost), set.history(ghost).len()),
        (None, "", 0)
    );
    assert!(!set.eligible(ghost));
}

#[test]
fn history_keeps_the_last_sixteen() {
    let t0 = Instant::now();
    let (mut set, ids) = active_set(HealthConfig::default(), &Policy::ServiceTime, &[0, 0], t0);
    let a = ids[0];
    for k in 0..20u64 {
        set.connection_lost(a, format!("loss {k}"), t0 + ms(10 * k));
        set.logged_in(a, t0 + ms(10 * k + 5));
    }
    let history = set.history(a);
    assert_eq!(history.len(), HISTORY_LEN);
    let (t, state, reason) = history.last().unwrap();
    assert_eq!(
        (*t, *state, reason.as_str()),
        (t0 + ms(195), "probing", "logged in, probing")
    );
}

#[derive(Debug, Clone)]
enum Op {
    LoggedIn(u32),
    LoginFailed(u32),
    Lost(u32),
    Answer(u32),
    Alua(u32, u8),
    Sample(u32, u64, u64, Option<u64>),
    Failback,
    Remove(u32),
    Timeout,
    Wait(u64),
}

fn arb_op() -> impl Strategy<Value = Op> {
    let id = 0u32..5;
    prop_oneof![
        1 => id.clone().prop_map(Op::LoggedIn),
        1 => id.clone().prop_map(Op::LoginFailed),
        1 => id.clone().prop_map(Op::Lost),
        4 => id.clone().prop_map(Op::Answer),
        1 => (id.clone(), 0u8..3).prop_map(|(i, t)| Op::Alua(i, t)),
        4 => (id.clone(), 0u64..200, 0u64..8, prop::option::of(0u64..8000)).prop_map(|(i, l, e, o)| Op::Sample(i, l, e, o)),
        1 => Just(Op::Failback),
        1 => id.prop_map(Op::Remove),
        4 => Just(Op::Timeout),
        4 => (0u64..700).prop_map(Op::Wait),
    ]
}

fn arb_set_policy() -> impl Strategy<Value = (Policy, Failback)> {
    (
        prop::sample::select(vec![
            Policy::ServiceTime,
            Policy::RoundRobinSubset { active: 2 },
            Policy::Failover,
        ]),
        prop::sample::select(vec![
            Failback::Immediate,
            Failback::Manual,
            Failback::After(ms(700)),
        ]),
    )
}

proptest! {
    /// Whatever the driver reports, in any order: no panic; every StateChanged continues from
    /// the state the previous one left, matches the history and the current state; eligible
    /// paths are Active; the subset is never exceeded; and a logged-in path always has a timer.
    #[test]
    fn any_sequence_keeps_the_books(
        (policy, failback) in arb_set_policy(),
        priorities in prop::collection::vec(0u32..3, 1..5),
        ops in prop::collection::vec(arb_op(), 0..120),
    ) {
        let mut now = Instant::now();
        let config = HealthConfig { failback, ..HealthConfig::default() };
        let mut set = PathSet::with_policy(config, &policy);
        let ids: Vec<_> = priorities.iter().map(|&p| set.add("p".into(), 1, p, now)).collect();
        let mut last: Vec<&'static str> = vec!["connecting"; ids.len()];
        let mut changes_seen = vec![0usize; ids.len()];
        for op in ops {
            let pick = |i: u32| PathId(i % ids.len() as u32);
            match op {
                Op::LoggedIn(i) => set.logged_in(pick(i), now),
                Op::LoginFailed(i) => set.login_failed(pick(i), "refused".into(), now),
                Op::Lost(i) => set.connection_lost(pick(i), "eof".into(), now),
                Op::Answer(i) => set.ping_answered(pick(i), ms(1), now),
                Op::Alua(i, t) => set.set_alua(pick(i), t, now),
                Op::Sample(i, latency, errors, oldest) => set.sample(
                    pick(i),
                    PathSample {
                        completed: 1,
                        errors,
                        latency_p50: ms(latency),
                        oldest_inflight: oldest.map(ms),
                        ..PathSample::default()
                    },
                    now,
                ),
                Op::Failback => set.failback_now(),
                Op::Remove(i) => set.remove(pick(i), now),
                Op::Timeout => {
                    if let Some(t) = set.poll_timeout() {
                        now = now.max(t);
                        set.handle_timeout(now);
                    }
                }
                Op::Wait(n) => now += ms(n),
            }
            while let Some(e) = set.poll_event() {
                if let Event::StateChanged { path, from, to, .. } = e {
                    let k = path.0 as usize;
                    prop_assert_eq!(from, last[k], "{} jumped", path);
                    last[k] = to;
                    changes_seen[k] += 1;
                }
            }
            let mut eligible = 0;
            for &id in &ids {
                let state = set.state(id).unwrap();
                prop_assert_eq!(state.name(), last[id.0 as usize]);
                let history = set.history(id);
                prop_assert_eq!(history.len(), (changes_seen[id.0 as usize] + 1).min(HISTORY_LEN));
                prop_assert_eq!(history.last().unwrap().1, state.name());
                if set.eligible(id) {
                    eligible += 1;
                    let active = matches!(state, PathState::Active { .. });
                    prop_assert!(active, "eligible but {}", state);
                }
                if state.is_logged_in() || matches!(state, PathState::Failed { .. }) {
                    prop_assert!(set.poll_timeout().is_some());
                }
                if set.failback_pending(id) {
                    prop_assert!(policy == Policy::Failover && failback != Failback::Immediate);
                    let probing = matches!(state, PathState::Probing { .. });
                    prop_assert!(probing, "failback pending but {}", state);
                }
            }
            if let Policy::RoundRobinSubset { active } = policy {
                prop_assert!(eligible <= active);
            }
        }
    }
}
