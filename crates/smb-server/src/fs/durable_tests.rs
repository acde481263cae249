//! Durable opens against a real share in a temporary directory: what gets durability, the
//! orphan kept after its session, reconnect checks, expiry, replayed CREATEs and the
//! ChannelSequence rules.

use std::path::Path;
use std::sync::atomic::AtomicBool;

use smb_proto::crypto::{PreauthHash, SessionKeys, SigningAlgorithm};
use smb_proto::msg::create::{CTX_DURABLE_HANDLE_RECONNECT, CTX_DURABLE_HANDLE_REQUEST};
use smb_proto::msg::create_ctx::DurableResponseV2;
use smb_proto::msg::CreateResponse;
use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};

use super::*;
use crate::fs::lease::{OPLOCK_BATCH, OPLOCK_NONE};
use crate::fs::replay::{begin, replayed_create, DUPLICATE_OBJECTID, FILE_NOT_AVAILABLE};
use crate::state::{Session, SessionState, Share, Tree};

const GUID: [u8; 16] = [3; 16];
const CLIENT: [u8; 16] = [8; 16];

pub(crate) struct Env {
    pub(crate) server: Arc<Server>,
    pub(crate) share: Arc<Share>,
    tx: UnboundedSender<Vec<u8>>,
    _dir: tempfile::TempDir,
}

pub(crate) fn env() -> Env {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().canonicalize().expect("canonical root");
    let share = Arc::new(Share::new("share".into(), root, false, Vec::new()));
    let server = Arc::new(Server::new(
        crate::config::SmbConfig::new(Path::new("/nonexistent")),
        vec![share.clone()],
        crate::users::Users::new(),
    ));
    let (tx, rx) = unbounded_channel();
    std::mem::forget(rx);
    Env {
        server,
        share,
        tx,
        _dir: dir,
    }
}

pub(crate) fn session(server: &Server, id: u64, user: &str) -> Arc<Session> {
    let s = Arc::new(Session {
        id,
        user: user.into(),
        dialect: 0x0311,
        client_guid: CLIENT,
        signing: SigningAlgorithm::AesCmac,
        cipher: None,
        keys: SessionKeys::derive_311(&[1; 16], &PreauthHash::default(), None),
        session_key: [1; 16],
        signing_required: false,
        state: parking_lot::Mutex::new(SessionState {
            channels: 1,
            ..SessionState::default()
        }),
        closed: AtomicBool::new(false),
        binds: Default::default(),
        channels_lost: Default::default(),
    });
    server.add_session(s.clone());
    s
}

pub(crate) fn tree(share: &Arc<Share>) -> Arc<Tree> {
    Arc::new(Tree {
        id: 5,
        share: Some(share.clone()),
        read_only: false,
    })
}

pub(crate) fn utf16(s: &str) -> Vec<u8> {
    s.encode_utf16().flat_map(u16::to_le_bytes).collect()
}

fn dh2q(guid: [u8; 16], timeout: u32) -> Vec<u8> {
    let mut d = Vec::new();
    DurableRequestV2 {
        timeout,
        flags: 0,
        create_guid: guid,
    }
    .encode(&mut d);
    d
}

fn dh2c(fid: FileId, guid: [u8; 16]) -> Vec<u8> {
    let mut d = Vec::new();
    DurableReconnectV2 {
        file_id: fid,
        create_guid: guid,
        flags: 0,
    }
    .encode(&mut d);
    d
}

pub(crate) fn request<'a>(
    name: &'a [u8],
    oplock: u8,
    contexts: Vec<CreateContext<'a>>,
) -> CreateRequest<'a> {
    CreateRequest {
        security_flags: 0,
        requested_oplock_level: oplock,
        impersonation_level: 2,
        smb_create_flags: 0,
        desired_access: 0x0012_019F,
        file_attributes: 0,
        share_access: 0,
        create_disposition: 3,
        create_options: 0,
        name,
        contexts,
    }
}

pub(crate) fn ctx<'a>(e: &'a Env, s: &'a Arc<Session>, t: &'a Arc<Tree>) -> Ctx<'a> {
    Ctx {
        server: &e.server,
        session: s,
        tree: t,
        tx: &e.tx,
        channel_sequence: 0,
    }
}

/// The CREATE response in `out` (prefix and header space first).
fn response(out: &[u8]) -> CreateResponse<'_> {
    CreateResponse::decode(&out[4..]).expect("CREATE response")
}

pub(crate) fn blank() -> Vec<u8> {
    vec![0u8; 4 + smb_proto::HEADER_LEN]
}

/// Creates `f.dat` with a batch oplock and DH2Q; returns its FileId.
fn durable_open(e: &Env, s: &Arc<Session>, t: &Arc<Tree>, timeout: u32) -> FileId {
    let name = utf16("f.dat");
    let d = dh2q(GUID, timeout);
    let req = request(
        &name,
        OPLOCK_BATCH,
        vec![CreateContext {
            name: CTX_DURABLE_HANDLE_REQUEST_V2,
            data: &d,
        }],
    );
    let mut out = blank();
    let r = super::super::open::create(&ctx(e, s, t), &req, &mut out).expect("create");
    let resp = response(&out);
    assert_eq!(resp.oplock_level, OPLOCK_BATCH);
    let granted = resp
        .contexts
        .iter()
        .find(|c| c.name == CTX_DURABLE_HANDLE_REQUEST_V2)
        .map(|c| DurableResponseV2::decode(c.data).expect("DH2Q response"));
    let want = if timeout == 0 {
        DEFAULT_TIMEOUT_MS
    } else {
        timeout.min(MAX_TIMEOUT_MS)
    };
    assert_eq!(
        granted,
        Some(DurableResponseV2 {
            timeout: want,
            flags: 0
        })
    );
    r.file_id.expect("file id")
}

fn reconnect_with(
    e: &Env,
    s: &Arc<Session>,
    t: &Arc<Tree>,
    fid: FileId,
    guid: [u8; 16],
) -> Result<Vec<u8>, NtStatus> {
    let name = utf16("");
    let d = dh2c(fid, guid);
    let req = request(
        &name,
        0x78,
        vec![CreateContext {
            name: CTX_DURABLE_HANDLE_RECONNECT_V2,
            data: &d,
        }],
    );
    let ask = DurableAsk::parse(&req)?;
    let mut out = blank();
    reconnect(&ctx(e, s, t), &req, &ask, &mut out).map(|_| out)
}

#[test]
fn a_durable_open_outlives_its_session_and_reconnects_once() {
    let e = env();
    let t = tree(&e.share);
    let s1 = session(&e.server, 11, "alice");
    let fid = durable_open(&e, &s1, &t, u32::MAX);
    // Still connected: no reconnect.
    assert_eq!(
        reconnect_with(&e, &s1, &t, fid, GUID).err(),
        Some(NtStatus::OBJECT_NAME_NOT_FOUND)
    );
    crate::session::end_session(&e.server, &s1, true);
    assert_eq!(e.server.orphans.lock().len(), 1);
    // The share-mode entry stays: another open of the file is refused.
    let s2 = session(&e.server, 12, "alice");
    let name = utf16("f.dat");
    let plain = request(&name, OPLOCK_NONE, Vec::new());
    let mut out = blank();
    // (the purge of conflicting orphans runs in dispatch, not in create)
    assert_eq!(
        super::super::open::create(&ctx(&e, &s2, &t), &plain, &mut out).err(),
        Some(crate::fs::status::SHARING_VIOLATION)
    );
    assert_eq!(
        reconnect_with(&e, &s2, &t, fid, [4; 16]).err(),
        Some(NtStatus::OBJECT_NAME_NOT_FOUND)
    );
    let bob = session(&e.server, 13, "bob");
    assert_eq!(
        reconnect_with(&e, &bob, &t, fid, GUID).err(),
        Some(NtStatus::ACCESS_DENIED)
    );
    let out = reconnect_with(&e, &s2, &t, fid, GUID).expect("reconnect");
    let resp = response(&out);
    assert_eq!(resp.file_id, fid);
    assert_eq!(resp.create_action, 1);
    assert_eq!(resp.oplock_level, OPLOCK_BATCH);
    assert!(resp.contexts.is_empty());
    assert!(s2.open(fid, t.id).is_some());
    assert!(e.server.orphans.lock().is_empty());
    assert_eq!(
        reconnect_with(&e, &s2, &t, fid, GUID).err(),
        Some(NtStatus::OBJECT_NAME_NOT_FOUND)
    );
}

#[test]
fn an_orphan_expires_at_its_deadline_and_frees_the_file() {
    let e = env();
    let t = tree(&e.share);
    let s1 = session(&e.server, 21, "alice");
    let fid = durable_open(&e, &s1, &t, 0);
    crate::session::end_session(&e.server, &s1, true);
    let now = Instant::now();
    assert_eq!(expire(&e.server, now), 0);
    assert!(!e.server.files.lock().is_empty());
    let later = now + Duration::from_millis(u64::from(DEFAULT_TIMEOUT_MS) + 1);
    assert_eq!(expire(&e.server, later), 1);
    assert!(e.server.files.lock().is_empty());
    assert!(e.server.create_guids.lock().is_empty());
    let s2 = session(&e.server, 22, "alice");
    assert_eq!(
        reconnect_with(&e, &s2, &t, fid, GUID).err(),
        Some(NtStatus::OBJECT_NAME_NOT_FOUND)
    );
}

#[test]
fn logoff_closes_durable_opens_and_non_batch_opens_are_not_durable() {
    let e = env();
    let t = tree(&e.share);
    let s1 = session(&e.server, 31, "alice");
    durable_open(&e, &s1, &t, 0);
    crate::session::end_session(&e.server, &s1, false);
    assert!(e.server.orphans.lock().is_empty());
    assert!(e.server.files.lock().is_empty());

    let s2 = session(&e.server, 32, "alice");
    let name = utf16("g.dat");
    let d = dh2q([5; 16], 0);
    let req = request(
        &name,
        OPLOCK_NONE,
        vec![CreateContext {
            name: CTX_DURABLE_HANDLE_REQUEST_V2,
            data: &d,
        }],
    );
    let mut out = blank();
    super::super::open::create(&ctx(&e, &s2, &t), &req, &mut out).expect("create");
    assert!(response(&out).contexts.is_empty());
    crate::session::end_session(&e.server, &s2, true);
    assert!(e.server.orphans.lock().is_empty());
    assert!(e.server.files.lock().is_empty());
}

#[test]
fn a_replayed_create_answers_the_same_open_once() {
    let e = env();
    let t = tree(&e.share);
    let s = session(&e.server, 41, "alice");
    let fid = durable_open(&e, &s, &t, 0);
    let name = utf16("f.dat");
    let d = dh2q(GUID, 0);
    let req = request(
        &name,
        OPLOCK_BATCH,
        vec![CreateContext {
            name: CTX_DURABLE_HANDLE_REQUEST_V2,
            data: &d,
        }],
    );
    let ask = DurableAsk::parse(&req).expect("contexts");
    let mut out = blank();
    // Without the replay flag the CreateGuid is a duplicate.
    assert_eq!(
        replayed_create(&ctx(&e, &s, &t), &req, &ask, false, &mut out).and_then(Result::err),
        Some(DUPLICATE_OBJECTID)
    );
    // Another session may use the same CreateGuid: a CREATE like any other there.
    let other = session(&e.server, 42, "alice");
    assert!(replayed_create(&ctx(&e, &other, &t), &req, &ask, false, &mut blank()).is_none());
    assert!(replayed_create(&ctx(&e, &other, &t), &req, &ask, true, &mut blank()).is_none());
    let r = replayed_create(&ctx(&e, &s, &t), &req, &ask, true, &mut out)
        .expect("a replay")
        .expect("answered");
    assert_eq!(r.file_id, Some(fid));
    let resp = response(&out);
    assert_eq!((resp.create_action, resp.oplock_level), (2, OPLOCK_BATCH));
    assert_eq!(s.state.lock().opens.len(), 1);
    // Replayed without an oplock: no oplock and no durability in the answer, the open keeps
    // its batch oplock.
    let none = request(&name, OPLOCK_NONE, req.contexts.clone());
    let mut out = blank();
    replayed_create(&ctx(&e, &s, &t), &none, &ask, true, &mut out)
        .expect("a replay")
        .expect("answered");
    let resp = response(&out);
    assert_eq!(resp.oplock_level, OPLOCK_NONE);
    assert!(resp.contexts.is_empty());
    let open = s.open(fid, t.id).expect("open");
    assert_eq!(
        caching_of(&e.server, &open).0,
        lease::oplock_state(OPLOCK_BATCH)
    );
    // A CREATE still waiting for breaks: its replay is not available yet.
    let pending = dh2q([6; 16], 0);
    let preq = request(
        &name,
        OPLOCK_BATCH,
        vec![CreateContext {
            name: CTX_DURABLE_HANDLE_REQUEST_V2,
            data: &pending,
        }],
    );
    let pask = DurableAsk::parse(&preq).expect("contexts");
    set_pending(&e.server, CLIENT, [6; 16], true);
    assert_eq!(
        replayed_create(&ctx(&e, &s, &t), &preq, &pask, true, &mut blank()).and_then(Result::err),
        Some(FILE_NOT_AVAILABLE)
    );
    set_pending(&e.server, CLIENT, [6; 16], false);
    assert!(replayed_create(&ctx(&e, &s, &t), &preq, &pask, true, &mut blank()).is_none());
    // Once another request used the open, a replay is a CREATE like any other.
    drop(begin(&open, 0, false, false));
    assert!(replayed_create(&ctx(&e, &s, &t), &req, &ask, true, &mut blank()).is_none());
}

#[test]
fn request_and_reconnect_contexts_do_not_mix() {
    let name = utf16("f.dat");
    let q = dh2q(GUID, 0);
    let c = dh2c(FileId::default(), GUID);
    let v1 = [0u8; 16];
    for pair in [
        [
            (CTX_DURABLE_HANDLE_REQUEST_V2, &q[..]),
            (CTX_DURABLE_HANDLE_RECONNECT_V2, &c[..]),
        ],
        [
            (CTX_DURABLE_HANDLE_REQUEST, &v1[..]),
            (CTX_DURABLE_HANDLE_RECONNECT_V2, &c[..]),
        ],
        [
            (CTX_DURABLE_HANDLE_REQUEST, &v1[..]),
            (CTX_DURABLE_HANDLE_REQUEST_V2, &q[..]),
        ],
        [
            (CTX_DURABLE_HANDLE_RECONNECT, &v1[..]),
            (CTX_DURABLE_HANDLE_RECONNECT_V2, &c[..]),
        ],
    ] {
        let contexts = pair
            .iter()
            .map(|(n, d)| CreateContext { name: n, data: d })
            .collect();
        let req = request(&name, OPLOCK_BATCH, contexts);
        assert_eq!(
            DurableAsk::parse(&req).err(),
            Some(NtStatus::INVALID_PARAMETER)
        );
    }
    // DHnQ beside DHnC is ignored (MS-SMB2 3.3.5.9.7).
    let both = request(
        &name,
        OPLOCK_BATCH,
        vec![
            CreateContext {
                name: CTX_DURABLE_HANDLE_REQUEST,
                data: &v1,
            },
            CreateContext {
                name: CTX_DURABLE_HANDLE_RECONNECT,
                data: &v1,
            },
        ],
    );
    assert!(DurableAsk::parse(&both).is_ok_and(|a| a.is_reconnect()));
    let short = [0u8; 31];
    let req = request(
        &name,
        OPLOCK_BATCH,
        vec![CreateContext {
            name: CTX_DURABLE_HANDLE_REQUEST_V2,
            data: &short,
        }],
    );
    assert_eq!(
        DurableAsk::parse(&req).err(),
        Some(NtStatus::INVALID_PARAMETER)
    );
}

#[test]
fn channel_sequence_rules() {
    let e = env();
    let t = tree(&e.share);
    let s = session(&e.server, 51, "alice");
    let fid = durable_open(&e, &s, &t, 0);
    let open = s.open(fid, t.id).expect("open");
    let same = begin(&open, 0, false, true).expect("same sequence");
    assert_eq!(open.channel.lock().outstanding, 1);
    drop(same);
    assert_eq!(open.channel.lock().outstanding, 0);
    // 0x8000 ahead counts as older.
    assert_eq!(
        begin(&open, 0x8000, false, true).err(),
        Some(FILE_NOT_AVAILABLE)
    );
    // A READ with a stale sequence goes on, uncounted.
    assert!(matches!(begin(&open, 0x8000, false, false), Ok(None)));
    // A newer sequence while a request of the old one is outstanding: a replay now fails.
    let old = begin(&open, 0, false, true).expect("old");
    let newer = begin(&open, 1, false, true).expect("newer");
    assert_eq!(open.channel.lock().sequence, 1);
    assert_eq!(begin(&open, 1, true, true).err(), Some(FILE_NOT_AVAILABLE));
    assert_eq!(begin(&open, 0, false, true).err(), Some(FILE_NOT_AVAILABLE));
    drop(old);
    assert!(matches!(begin(&open, 1, true, true), Ok(Some(_))));
    drop(newer);
    assert_eq!(
        *open.channel.lock(),
        crate::fs::replay::ChannelState {
            sequence: 1,
            outstanding: 0,
            pre_outstanding: 0
        }
    );
}

#[test]
fn a_dh2q_open_reconnects_through_dhnc() {
    let e = env();
    let t = tree(&e.share);
    let s1 = session(&e.server, 61, "alice");
    let fid = durable_open(&e, &s1, &t, 0);
    crate::session::end_session(&e.server, &s1, true);
    let s2 = session(&e.server, 62, "alice");
    let name = utf16("f.dat");
    let mut d = fid.persistent.to_le_bytes().to_vec();
    d.extend_from_slice(&fid.volatile.to_le_bytes());
    let req = request(
        &name,
        0,
        vec![CreateContext {
            name: CTX_DURABLE_HANDLE_RECONNECT,
            data: &d,
        }],
    );
    let ask = DurableAsk::parse(&req).expect("contexts");
    assert_eq!(ask.reconnect_v1, Some(fid));
    let mut out = blank();
    let r = reconnect(&ctx(&e, &s2, &t), &req, &ask, &mut out).expect("reconnect");
    assert_eq!(r.file_id, Some(fid));
    assert_eq!(response(&out).oplock_level, OPLOCK_BATCH);
    assert!(e.server.orphans.lock().is_empty());
}

/// The DH2C of `fid` on `s`, as dispatch runs it: first waiting for the open to be orphaned
/// when another session of the user still holds it.
async fn reconnect_after_wait(
    e: &Env,
    s: &Arc<Session>,
    t: &Arc<Tree>,
    fid: FileId,
) -> Result<Vec<u8>, NtStatus> {
    await_orphan(&e.server, s, fid.persistent).await;
    reconnect_with(e, s, t, fid, GUID)
}

/// A client that closed its connection and reconnects before the server has read that close
/// (the old connection's task not run yet on a busy server): the reconnect waits for the old
/// session to end, and takes the open then.
#[tokio::test(flavor = "current_thread")]
async fn a_reconnect_waits_for_the_old_connection_to_end() {
    let e = Arc::new(env());
    let t = tree(&e.share);
    let s1 = session(&e.server, 21, "alice");
    let fid = durable_open(&e, &s1, &t, u32::MAX);
    let s2 = session(&e.server, 22, "alice");
    let waiter = {
        let (e, s2, t) = (e.clone(), s2.clone(), t.clone());
        tokio::spawn(async move { reconnect_after_wait(&e, &s2, &t, fid).await })
    };
    // One turn of this single-threaded runtime: the reconnect runs up to its wait.
    tokio::task::yield_now().await;
    assert!(!waiter.is_finished(), "the reconnect did not wait");
    crate::session::end_session(&e.server, &s1, true);
    let out = waiter
        .await
        .expect("task")
        .expect("reconnect after the old session ended");
    assert_eq!(response(&out).file_id, fid);
    assert!(s2.open(fid, t.id).is_some());
}

/// An open its first session still uses is not taken: after the wait the reconnect fails as
/// it always did (and a reconnect on the holding session itself does not wait).
#[tokio::test(flavor = "current_thread")]
async fn a_reconnect_to_an_open_still_in_use_fails_after_the_wait() {
    let e = env();
    let t = tree(&e.share);
    let s1 = session(&e.server, 31, "alice");
    let fid = durable_open(&e, &s1, &t, u32::MAX);
    let start = tokio::time::Instant::now();
    assert_eq!(
        reconnect_after_wait(&e, &s1, &t, fid).await.err(),
        Some(NtStatus::OBJECT_NAME_NOT_FOUND)
    );
    // On the holding session itself: no wait (the wait would be RECONNECT_WAIT at least).
    assert!(start.elapsed() < RECONNECT_WAIT, "{:?}", start.elapsed());
    let s2 = session(&e.server, 32, "alice");
    let waited = tokio::time::Instant::now();
    assert_eq!(
        reconnect_after_wait(&e, &s2, &t, fid).await.err(),
        Some(NtStatus::OBJECT_NAME_NOT_FOUND)
    );
    assert!(waited.elapsed() >= RECONNECT_WAIT);
    assert!(s1.open(fid, t.id).is_some());
}
