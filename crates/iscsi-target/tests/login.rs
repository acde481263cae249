//! Login over real sockets: SendTargets discovery across portal groups, session reinstatement,
//! allow-multiple-sessions, ACLs, and CHAP (one-way and mutual, every CHAP_A).

mod support;

use lanes_test_support::config::ConfigToml;
use support::*;

const OTHER_INITIATOR: &str = "iqn.2026-01.test.lanes:other";

fn two_groups_toml(target_extra: &str) -> String {
    ConfigToml::new("{dir}", TARGET)
        .portal_group(1, &["127.0.0.1:0"])
        .portal_group(2, &["127.0.0.2:0"])
        .target_lines(target_extra)
        .build()
}

fn addresses(answer: &[(String, String)]) -> Vec<String> {
    let mut v: Vec<String> = answer
        .iter()
        .filter(|(k, _)| k == "TargetAddress")
        .map(|(_, v)| v.clone())
        .collect();
    v.sort();
    v
}

#[test]
fn send_targets_lists_every_portal_with_its_tpgt() {
    let server = TestServer::start(&two_groups_toml(""));
    let p1 = server.portals.iter().find(|p| p.0 == 1).unwrap().1;
    let p2 = server.portals.iter().find(|p| p.0 == 2).unwrap().1;
    let mut expected = vec![format!("{p1},1"), format!("{p2},2")];
    expected.sort();

    let mut d = Conn::login_to(p1, &LoginOpts::discovery());
    let answer = d.text(b"SendTargets=All\0");
    let names: Vec<_> = answer.iter().filter(|(k, _)| k == "TargetName").collect();
    assert_eq!(names.len(), 1, "{answer:?}");
    assert_eq!(names[0].1, TARGET);
    assert_eq!(addresses(&answer), expected);
    assert_eq!(d.logout(0, 1), 0);

    // In a normal session too, on the second portal group; the login reports TPGT 2.
    let mut n = Conn::login_to(p2, &LoginOpts::normal());
    assert_eq!(n.negotiated.tpgt, Some(2));
    let answer = n.text(b"SendTargets=All\0");
    assert_eq!(addresses(&answer), expected);
}

#[test]
fn reinstatement_ends_the_old_session() {
    let server = TestServer::simple("");
    let mut old = Conn::login_to(server.addr(), &LoginOpts::normal());
    let mut new = Conn::login_to(server.addr(), &LoginOpts::normal());
    let (closed, _) = old.wait_closed(TIMEOUT);
    assert!(closed, "the reinstated session's connection is closed");
    let d = pattern(20, 1024);
    new.write10(8, &d);
    assert_eq!(new.read10(8, 2), d);
}

#[test]
fn single_session_per_initiator_when_multiple_sessions_are_off() {
    let server = TestServer::simple("allow-multiple-sessions = false");
    let mut first = Conn::login_to(server.addr(), &LoginOpts::normal());
    let mut second = Conn::connect(server.addr());
    let err = second
        .login(&LoginOpts {
            isid: [0x80, 0, 0, 0x12, 0x34, 0x09],
            ..LoginOpts::normal()
        })
        .expect_err("second session of the same initiator is refused");
    assert!(matches!(err, LoginError::Status(2, _)), "{err:?}");
    let _other = Conn::login_to(
        server.addr(),
        &LoginOpts {
            initiator: OTHER_INITIATOR.into(),
            isid: [0x80, 0, 0, 0x12, 0x34, 0x09],
            ..LoginOpts::normal()
        },
    );
    assert_eq!(first.tur().0, 0, "the first session is untouched");
}

#[test]
fn initiator_outside_the_acl_gets_authorization_failure() {
    let server = TestServer::simple(&format!("acl = [\"{OTHER_INITIATOR}\"]"));
    let mut c = Conn::connect(server.addr());
    assert_eq!(
        c.login(&LoginOpts::normal()).unwrap_err(),
        LoginError::Status(2, 2)
    );
    assert!(c.wait_closed(TIMEOUT).0);
    Conn::login_to(
        server.addr(),
        &LoginOpts {
            initiator: OTHER_INITIATOR.into(),
            ..LoginOpts::normal()
        },
    );
}

const CHAP_SECRET: &str = "initiator-secret-0123";
const MUTUAL_SECRET: &str = "target-secret-456789";

fn chap_server() -> TestServer {
    TestServer::simple(&format!(
        "[target.chap]\nuser = \"host1\"\nsecret = \"{CHAP_SECRET}\"\nmutual-user = \"lanes\"\nmutual-secret = \"{MUTUAL_SECRET}\"\n"
    ))
}

fn chap(algorithm: u8, secret: &str, mutual: bool) -> LoginOpts {
    LoginOpts {
        chap: Some(Chap {
            user: "host1".into(),
            secret: secret.as_bytes().to_vec(),
            algorithm,
            mutual: mutual.then(|| ("lanes".into(), MUTUAL_SECRET.as_bytes().to_vec())),
        }),
        ..LoginOpts::normal()
    }
}

#[test]
fn chap_one_way_and_mutual_with_every_algorithm() {
    let server = chap_server();
    for algorithm in [5u8, 6, 7, 8] {
        for mutual in [false, true] {
            let mut c = Conn::connect(server.addr());
            c.login(&chap(algorithm, CHAP_SECRET, mutual))
                .unwrap_or_else(|e| panic!("CHAP_A={algorithm} mutual={mutual}: {e:?}"));
            c.clear_unit_attentions();
            assert_eq!(c.logout(0, 1), 0);
        }
    }
}

#[test]
fn chap_wrong_secret_fails_with_0201_and_closes() {
    let server = chap_server();
    for algorithm in [5u8, 7] {
        let mut c = Conn::connect(server.addr());
        let err = c
            .login(&chap(algorithm, "not-the-right-secret", false))
            .unwrap_err();
        assert_eq!(err, LoginError::Status(2, 1), "CHAP_A={algorithm}");
        assert!(
            c.wait_closed(TIMEOUT).0,
            "connection closed after failed CHAP"
        );
    }
    // Without CHAP at all: refused too.
    let mut c = Conn::connect(server.addr());
    assert!(matches!(
        c.login(&LoginOpts::normal()),
        Err(LoginError::Status(2, _))
    ));
}

#[test]
fn secrets_do_not_appear_in_config_debug_output() {
    let dir = tempfile::tempdir().unwrap();
    let text = simple_toml(&format!(
        "[target.chap]\nuser = \"host1\"\nsecret = \"{CHAP_SECRET}\"\nmutual-user = \"lanes\"\nmutual-secret = \"{MUTUAL_SECRET}\"\n"
    ))
    .replace("{dir}", &dir.path().display().to_string());
    let config =
        lanes_iscsi_target::config::ServeConfig::from_toml_str(&text, &dir.path().join("x.toml"))
            .unwrap();
    let debug = format!("{config:?} {config:#?}");
    assert!(debug.contains("host1"), "the user is shown");
    assert!(!debug.contains(CHAP_SECRET), "secret leaked: {debug}");
    assert!(!debug.contains(MUTUAL_SECRET), "mutual secret leaked");
}
