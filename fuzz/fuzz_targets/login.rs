//! Fuzz target: a sequence of Login Requests through `TargetLogin` with a fake policy.
//! Input: repeated records of [flags, csg/nsg, ids, len, text...].
#![no_main]

use bytes::Bytes;
use iscsi_proto::chap::ChapCredentials;
use iscsi_proto::login::{LoginOutcome, LoginPolicy, LoginRefusal, LoginStep, TargetLogin};
use iscsi_proto::negotiation::TargetDefaults;
use iscsi_proto::pdu::LoginRequest;
use libfuzzer_sys::fuzz_target;

struct Policy {
    chap: bool,
    counter: u8,
}

impl LoginPolicy for Policy {
    fn portal_group_tag(&self) -> u16 {
        1
    }
    fn authorize(
        &mut self,
        _: &str,
        target: &str,
    ) -> Result<Option<ChapCredentials>, LoginRefusal> {
        if target.ends_with("nope") {
            return Err(LoginRefusal::NotFound);
        }
        Ok(self.chap.then(|| ChapCredentials {
            user: "user".into(),
            secret: b"0123456789abcdef".to_vec(),
            mutual: Some(("target".into(), b"fedcba9876543210".to_vec())),
            algorithms: vec![],
        }))
    }
    fn discovery_auth(&mut self, _: &str) -> Result<Option<ChapCredentials>, LoginRefusal> {
        Ok(None)
    }
    fn admit(&mut self, login: &LoginOutcome) -> Result<u16, LoginRefusal> {
        match login.tsih {
            0 => Ok(1),
            1 => Ok(1),
            _ => Err(LoginRefusal::SessionDoesNotExist),
        }
    }
    fn fill_random(&mut self, buf: &mut [u8]) {
        for b in buf {
            self.counter = self.counter.wrapping_add(13);
            *b = self.counter;
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, mut rest)) = data.split_first() else {
        return;
    };
    let mut policy = Policy {
        chap: mode & 1 != 0,
        counter: 0,
    };
    let mut login = TargetLogin::new(TargetDefaults::default());
    while let [flags, stages, ids, len, tail @ ..] = rest {
        let n = usize::from(*len).min(tail.len());
        let (text, next) = tail.split_at(n);
        rest = next;
        let req = LoginRequest {
            transit: flags & 0x80 != 0,
            continue_bit: flags & 0x40 != 0,
            csg: (stages >> 2) & 3,
            nsg: stages & 3,
            version_max: flags & 1,
            version_min: (flags >> 1) & 1,
            isid: [ids & 1, 0, 0, 0, 0, 0],
            tsih: u16::from((ids >> 1) & 3),
            itt: u32::from((ids >> 3) & 1),
            cid: u16::from((ids >> 4) & 1),
            cmd_sn: 1,
            exp_stat_sn: 1,
            data: Bytes::copy_from_slice(text),
        };
        match login.handle(&req, &mut policy) {
            LoginStep::Continue(_) => {}
            LoginStep::Complete(..) | LoginStep::Failed(..) => break,
        }
    }
});
