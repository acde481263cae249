//! The executor: runs a [`Plan`]'s commands with `ip`/`tc`/`nft`, keeps the lab's state file
//! under `/run/lanes-lab`, and removes everything again on `down`, on error and on interrupt.

use std::fs;
use std::io::{self, Write as _};
use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::fault::{self, FaultActions, FaultMode, FaultTarget};
use crate::options::{validate_name, Options};
use crate::plan::{real_namespace, Cmd, Plan};
use crate::relay::{self, RelayCommand};

/// Where lab state files live.
pub const STATE_DIR: &str = "/run/lanes-lab";

/// The signal a Ctrl-C sends.
const SIGINT: i32 = 2;

/// Short names a lab's namespaces can have.
const SHORT_NAMES: [&str; 5] = ["host", "node1", "node2", "witness", "sw"];

#[derive(Debug, thiserror::Error)]
pub enum LabError {
    #[error("{0}")]
    Invalid(String),
    #[error(
        "a lab named {name} is already up ({why}); remove it first with `lanes lab down {name}`"
    )]
    AlreadyUp { name: String, why: String },
    #[error("no lab named {0} is up")]
    NotUp(String),
    #[error("`{command}` failed ({status}): {stderr}")]
    Command {
        command: String,
        status: String,
        stderr: String,
    },
    #[error("could not run `{command}`: {source}")]
    Spawn {
        command: String,
        #[source]
        source: io::Error,
    },
    #[error("interrupted")]
    Interrupted,
    #[error("{cause}; everything it had created was removed")]
    RolledBack { cause: Box<LabError> },
    #[error("{cause}; removing what it had created also failed: {cleanup}")]
    RollbackFailed {
        cause: Box<LabError>,
        cleanup: String,
    },
    #[error("{}: {source}", .path.display())]
    State {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{}: not a lab state file: {source}", .path.display())]
    StateFormat {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

/// A fault in force, with the commands that take it back out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActiveFault {
    pub target: String,
    pub mode: String,
    pub undo: Vec<Cmd>,
    /// Relay processes of a delay, stopped after `undo` has run.
    #[serde(default)]
    pub relays: Vec<RelayProcess>,
}

/// A running delay relay.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RelayProcess {
    /// Short name of its namespace.
    pub namespace: String,
    pub pid: u32,
}

/// What is recorded in `/run/lanes-lab/NAME.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    pub plan: Plan,
    pub faults: Vec<ActiveFault>,
    /// The witness's etcd, while it runs.
    #[serde(default)]
    pub witness_pid: Option<u32>,
}

/// What `down` removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Down {
    pub namespaces: Vec<String>,
}

pub fn state_path(name: &str) -> PathBuf {
    Path::new(STATE_DIR).join(format!("{name}.json"))
}

/// Runs one command; the error names it and carries its stderr.
pub fn run_cmd(cmd: &Cmd) -> Result<String, LabError> {
    let (program, args) = cmd
        .0
        .split_first()
        .ok_or_else(|| LabError::Invalid("empty command".into()))?;
    let output = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|source| LabError::Spawn {
            command: cmd.to_string(),
            source,
        })?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else if output.status.signal() == Some(SIGINT) {
        // Ctrl-C reaches the whole process group, so the command died of it too.
        Err(LabError::Interrupted)
    } else {
        Err(LabError::Command {
            command: cmd.to_string(),
            status: output.status.to_string(),
            stderr: String::from_utf8_lossy(&output.stderr)
                .trim()
                .replace('\n', "; "),
        })
    }
}

/// The network namespaces that exist now (`ip netns list`).
pub fn existing_namespaces() -> Result<Vec<String>, LabError> {
    let out = run_cmd(&Cmd::new(["ip", "netns", "list"]))?;
    Ok(out
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect())
}

/// Builds a lab. On any error, and when `cancel` is set (Ctrl-C), everything created so far is
/// removed before returning.
pub fn up(options: &Options, cancel: &AtomicBool) -> Result<State, LabError> {
    let plan = Plan::new(options).map_err(LabError::Invalid)?;
    let name = &options.name;
    let existing = existing_namespaces()?;
    if let Some(ns) = plan
        .namespaces
        .iter()
        .find(|ns| existing.contains(&ns.real))
    {
        return Err(LabError::AlreadyUp {
            name: name.clone(),
            why: format!("namespace {} exists", ns.real),
        });
    }
    fs::create_dir_all(STATE_DIR).map_err(|source| LabError::State {
        path: STATE_DIR.into(),
        source,
    })?;
    let path = state_path(name);
    let file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path);
    let mut file = match file {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            return Err(LabError::AlreadyUp {
                name: name.clone(),
                why: format!("{} exists", path.display()),
            })
        }
        Err(source) => return Err(LabError::State { path, source }),
    };
    let mut state = State {
        plan,
        faults: Vec::new(),
        witness_pid: None,
    };
    let json = serde_json::to_vec_pretty(&state).map_err(|source| LabError::StateFormat {
        path: path.clone(),
        source,
    })?;
    if let Err(source) = file.write_all(&json) {
        let _ = fs::remove_file(&path);
        return Err(LabError::State { path, source });
    }
    drop(file);

    let mut created = Vec::new();
    let built = build(&state.plan, cancel, &mut created).and_then(|()| {
        if state.plan.options.pair.witness {
            state.witness_pid = Some(crate::witness::start(&state.plan)?);
            save(&state)?;
        }
        Ok(())
    });
    match built {
        Ok(()) => Ok(state),
        Err(cause) => {
            if let Some(pid) = state.witness_pid {
                crate::witness::stop(pid);
            }
            crate::witness::remove_files(name);
            // Ctrl-C also reaches the `ip` or `tc` that was running: report the interrupt,
            // not the command it killed.
            let cause = if cancel.load(Ordering::SeqCst) {
                LabError::Interrupted
            } else {
                cause
            };
            let cleanup = remove_namespaces(&created);
            let _ = fs::remove_file(&path);
            let cause = Box::new(cause);
            match cleanup {
                Ok(()) => Err(LabError::RolledBack { cause }),
                Err(e) => Err(LabError::RollbackFailed {
                    cause,
                    cleanup: e.to_string(),
                }),
            }
        }
    }
}

fn build(plan: &Plan, cancel: &AtomicBool, created: &mut Vec<String>) -> Result<(), LabError> {
    let check = || {
        if cancel.load(Ordering::SeqCst) {
            Err(LabError::Interrupted)
        } else {
            Ok(())
        }
    };
    for ns in &plan.namespaces {
        check()?;
        run_cmd(&Cmd::new(["ip", "netns", "add", &ns.real]))?;
        created.push(ns.real.clone());
    }
    for cmd in plan.setup.iter().chain(plan.routes.iter().map(|r| &r.cmd)) {
        check()?;
        run_cmd(cmd)?;
    }
    check()
}

/// Stops what still runs inside the namespaces, then deletes them (which deletes their veths,
/// bridges, qdiscs, rules and nftables tables). Namespaces already gone are skipped.
fn remove_namespaces(namespaces: &[String]) -> Result<(), LabError> {
    let mut first_error = None;
    for ns in namespaces {
        stop_processes(ns);
        if let Err(e) = run_cmd(&Cmd::new(["ip", "netns", "del", ns])) {
            let still_there = existing_namespaces()
                .map(|l| l.contains(ns))
                .unwrap_or(true);
            if still_there && first_error.is_none() {
                first_error = Some(e);
            }
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// A process left inside a namespace would keep it (and its links) alive after `ip netns del`.
fn stop_processes(ns: &str) {
    let pids = |ns: &str| -> Vec<String> {
        run_cmd(&Cmd::new(["ip", "netns", "pids", ns]))
            .map(|out| out.split_whitespace().map(str::to_string).collect())
            .unwrap_or_default()
    };
    let first = pids(ns);
    if first.is_empty() {
        return;
    }
    let mut kill = vec!["kill".to_string(), "-TERM".into()];
    kill.extend(first);
    let _ = run_cmd(&Cmd(kill));
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        if pids(ns).is_empty() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let rest = pids(ns);
    if !rest.is_empty() {
        let mut kill = vec!["kill".to_string(), "-KILL".into()];
        kill.extend(rest);
        let _ = run_cmd(&Cmd(kill));
    }
}

/// Reads a lab's state file.
pub fn state(name: &str) -> Result<State, LabError> {
    validate_name(name).map_err(LabError::Invalid)?;
    let path = state_path(name);
    let text = match fs::read(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(LabError::NotUp(name.to_string()))
        }
        Err(source) => return Err(LabError::State { path, source }),
    };
    serde_json::from_slice(&text).map_err(|source| LabError::StateFormat { path, source })
}

fn save(state: &State) -> Result<(), LabError> {
    let path = state_path(&state.plan.options.name);
    let tmp = path.with_extension("json.tmp");
    let json = serde_json::to_vec_pretty(state).map_err(|source| LabError::StateFormat {
        path: path.clone(),
        source,
    })?;
    fs::write(&tmp, json)
        .and_then(|()| fs::rename(&tmp, &path))
        .map_err(|source| LabError::State { path, source })
}

/// Removes a lab: its namespaces (found from the state file and, should that be lost, by
/// name) and its state file.
pub fn down(name: &str) -> Result<Down, LabError> {
    validate_name(name).map_err(LabError::Invalid)?;
    let recorded = match state(name) {
        Ok(state) => Some(state),
        Err(LabError::NotUp(_)) => None,
        // A damaged state file must not keep the lab from being removed.
        Err(LabError::StateFormat { .. }) => None,
        Err(e) => return Err(e),
    };
    let existing = existing_namespaces()?;
    let mut ours: Vec<String> = SHORT_NAMES
        .iter()
        .map(|short| real_namespace(name, short))
        .filter(|real| existing.contains(real))
        .collect();
    if let Some(state) = &recorded {
        for ns in &state.plan.namespaces {
            if existing.contains(&ns.real) && !ours.contains(&ns.real) {
                ours.push(ns.real.clone());
            }
        }
    }
    let path = state_path(name);
    if recorded.is_none() && ours.is_empty() && !path.exists() {
        return Err(LabError::NotUp(name.to_string()));
    }
    // Relays die with their namespaces too; stopping them by pid first is just quicker.
    for active in recorded.iter().flat_map(|s| &s.faults) {
        for process in &active.relays {
            relay::stop(process.pid, name);
        }
    }
    if let Some(pid) = recorded.as_ref().and_then(|s| s.witness_pid) {
        crate::witness::stop(pid);
    }
    remove_namespaces(&ours)?;
    crate::witness::remove_files(name);
    match fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(source) => return Err(LabError::State { path, source }),
    }
    Ok(Down { namespaces: ours })
}

/// Injects a fault; it stays until `restore`. A delay starts relay processes with `relay`
/// (see [`crate::delay`]); other modes do not use it.
pub fn fail(name: &str, target: &str, mode: &str, relay: &RelayCommand) -> Result<(), LabError> {
    let mut state = state(name)?;
    let target: FaultTarget = target.parse().map_err(LabError::Invalid)?;
    let mode: FaultMode = mode.parse().map_err(LabError::Invalid)?;
    if let Some(active) = state.faults.iter().find(|f| f.target == target.to_string()) {
        return Err(LabError::Invalid(format!(
            "{target} of lab {name} already has a fault ({}); restore it first with \
             `lanes lab restore {name} {target}`",
            active.mode
        )));
    }
    refuse_shared_nics(&state, target, mode)?;
    let actions = fault::actions(&state.plan, target, mode).map_err(LabError::Invalid)?;
    let mut relays = Vec::new();
    if let Err(e) = apply(name, &actions, relay, &mut relays) {
        for undo in &actions.undo {
            let _ = run_cmd(undo);
        }
        for process in &relays {
            relay::stop(process.pid, name);
        }
        return Err(explain_fault_error(mode, e));
    }
    state.faults.push(ActiveFault {
        target: target.to_string(),
        mode: mode.to_string(),
        undo: actions.undo,
        relays,
    });
    save(&state)
}

/// Starts a fault's relays (recording each in `relays` as it comes up), then runs its commands.
fn apply(
    name: &str,
    actions: &FaultActions,
    relay: &RelayCommand,
    relays: &mut Vec<RelayProcess>,
) -> Result<(), LabError> {
    for spec in &actions.relays {
        let real = real_namespace(name, &spec.namespace);
        let pid = relay::spawn(relay, &real, &spec.args)?;
        relays.push(RelayProcess {
            namespace: spec.namespace.clone(),
            pid,
        });
    }
    actions
        .apply
        .iter()
        .try_for_each(|cmd| run_cmd(cmd).map(drop))
}

/// Each NIC a delay takes over gets an ingress qdisc of its own: two delays may not share a
/// NIC. (Blackhole and loss also match packets a delay hands in through its TUN devices, so
/// they combine with a delay.)
fn refuse_shared_nics(state: &State, target: FaultTarget, mode: FaultMode) -> Result<(), LabError> {
    let plan = &state.plan;
    let ours = fault::delayed_nics(plan, target, mode).map_err(LabError::Invalid)?;
    for active in &state.faults {
        let (Ok(their_target), Ok(their_mode)) = (
            active.target.parse::<FaultTarget>(),
            active.mode.parse::<FaultMode>(),
        ) else {
            continue;
        };
        let theirs = fault::delayed_nics(plan, their_target, their_mode).unwrap_or_default();
        if let Some((ns, device)) = ours.iter().find(|nic| theirs.contains(nic)) {
            let name = &plan.options.name;
            return Err(LabError::Invalid(format!(
                "{target} ({mode}) would share {device} of {ns} with the delay on \
                 {their_target} ({their_mode}), and two delays cannot share a NIC; restore it \
                 first with `lanes lab restore {name} {their_target}`"
            )));
        }
    }
    Ok(())
}

/// Missing kernel features and tools get an error that says what is missing.
fn explain_fault_error(mode: FaultMode, error: LabError) -> LabError {
    match (&mode, &error) {
        (FaultMode::Delay { .. }, LabError::Command { command, .. })
            if command.starts_with("tc ") =>
        {
            LabError::Invalid(format!(
                "{mode} needs TUN devices and tc's ingress qdisc, u32 filter and mirred action \
             (CONFIG_TUN, CONFIG_NET_SCH_INGRESS, CONFIG_NET_CLS_U32, CONFIG_NET_ACT_MIRRED): \
             {error}"
            ))
        }
        (FaultMode::Loss { .. }, LabError::Command { stderr, .. })
            if stderr.contains("nft") && stderr.contains("No such file") =>
        {
            LabError::Invalid(format!(
                "{mode} needs the nft tool (Debian package nftables): {error}"
            ))
        }
        _ => error,
    }
}

/// Takes a target's fault back out (`all`: every fault of the lab).
pub fn restore(name: &str, target: &str) -> Result<Vec<String>, LabError> {
    let mut state = state(name)?;
    let wanted: Vec<ActiveFault> = if target == "all" {
        state.faults.clone()
    } else {
        let target: FaultTarget = target.parse().map_err(LabError::Invalid)?;
        let found: Vec<_> = state
            .faults
            .iter()
            .filter(|f| f.target == target.to_string())
            .cloned()
            .collect();
        if found.is_empty() {
            return Err(LabError::Invalid(format!(
                "{target} of lab {name} has no fault to restore"
            )));
        }
        found
    };
    let mut errors = Vec::new();
    for active in &wanted {
        for cmd in &active.undo {
            if let Err(e) = run_cmd(cmd) {
                errors.push(e.to_string());
            }
        }
        if let Ok(FaultMode::Delay {
            micros,
            jitter_micros,
        }) = active.mode.parse()
        {
            // With the redirects gone no new packet reaches the relays; the ones they hold
            // leave within D + J. Stopping the relays earlier would drop them, a loss the
            // restore itself would have caused.
            std::thread::sleep(Duration::from_micros(micros + jitter_micros + 5_000));
        }
        for process in &active.relays {
            relay::stop(process.pid, name);
        }
    }
    state.faults.retain(|f| !wanted.contains(f));
    save(&state)?;
    if errors.is_empty() {
        Ok(wanted
            .iter()
            .map(|f| format!("{} ({})", f.target, f.mode))
            .collect())
    } else {
        Err(LabError::Invalid(format!(
            "restoring left errors: {}",
            errors.join("; ")
        )))
    }
}

/// A command that runs ARGV inside one of the lab's namespaces (`host`, `node1`, ...).
pub fn exec_command(name: &str, namespace: &str, argv: &[String]) -> Result<Command, LabError> {
    let state = state(name)?;
    let ns = state.plan.namespace(namespace).ok_or_else(|| {
        let known: Vec<_> = state
            .plan
            .namespaces
            .iter()
            .map(|n| n.short.as_str())
            .collect();
        LabError::Invalid(format!(
            "lab {name} has no namespace {namespace:?} (it has {})",
            known.join(", ")
        ))
    })?;
    let (program, args) = argv
        .split_first()
        .ok_or_else(|| LabError::Invalid("no command given after --".into()))?;
    let mut command = Command::new("ip");
    command
        .args(["netns", "exec", &ns.real, program])
        .args(args);
    Ok(command)
}

/// Labs on this machine: those with a state file and those whose namespaces exist (a lab
/// whose state was lost is still listed, so `down` can be run on it).
pub fn list() -> Result<Vec<String>, LabError> {
    let mut names = Vec::new();
    if let Ok(entries) = fs::read_dir(STATE_DIR) {
        for entry in entries.flatten() {
            let file = entry.file_name();
            let file = file.to_string_lossy();
            if let Some(name) = file.strip_suffix(".json") {
                names.push(name.to_string());
            }
        }
    }
    for ns in existing_namespaces()? {
        let name = ns.strip_prefix("lanes-").and_then(|rest| {
            SHORT_NAMES
                .iter()
                .find_map(|short| rest.strip_suffix(short)?.strip_suffix('-'))
        });
        if let Some(name) = name.filter(|n| validate_name(n).is_ok()) {
            names.push(name.to_string());
        }
    }
    names.sort();
    names.dedup();
    Ok(names)
}

/// What `lanes lab witness` does to a pair's etcd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WitnessAction {
    /// SIGKILL (its data stays).
    Stop,
    /// Start it again on its data, if it is not running.
    Start,
    Restart,
}

/// Stops, starts or restarts the witness's etcd of a lab; the pid it runs with afterwards.
pub fn witness(name: &str, action: WitnessAction) -> Result<Option<u32>, LabError> {
    let mut state = state(name)?;
    if !state.plan.options.pair.witness {
        return Err(LabError::Invalid(format!(
            "lab {name} has no witness (it needs --storage-nodes 2 without --no-witness)"
        )));
    }
    if matches!(action, WitnessAction::Stop | WitnessAction::Restart) {
        if let Some(pid) = state.witness_pid.take() {
            crate::witness::stop(pid);
        }
        save(&state)?;
    }
    if matches!(action, WitnessAction::Start | WitnessAction::Restart)
        && state.witness_pid.is_none()
    {
        state.witness_pid = Some(crate::witness::start(&state.plan)?);
        save(&state)?;
    }
    Ok(state.witness_pid)
}
