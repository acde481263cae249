//! Chain and framing rules, each malformed case with the answer the server gives.

use smb_proto::msg::{EchoRequest, Message};
use smb_proto::{split_compound, Answer, Command, DecodeError, DirectTcp, Flags, Header, NtStatus};

fn echo(next: u32, flags: u32) -> Vec<u8> {
    let mut h = Header::decode(
        &[0xFE, b'S', b'M', b'B', 64, 0]
            .into_iter()
            .chain([0; 58])
            .collect::<Vec<_>>(),
    )
    .unwrap();
    h.command = Command::Echo;
    h.next_command = next;
    h.flags = Flags(flags);
    let mut m = h.to_bytes().to_vec();
    EchoRequest.encode(&mut m);
    m
}

fn padded(mut m: Vec<u8>, to: usize) -> Vec<u8> {
    m.resize(to, 0);
    m
}

fn invalid_parameter(e: DecodeError) {
    assert_eq!(
        e.answer(),
        Answer::Status(NtStatus::INVALID_PARAMETER),
        "{e}"
    );
}

#[test]
fn well_formed_chain_splits() {
    let mut f = padded(echo(72, 0), 72);
    f.extend(echo(0, Flags::RELATED_OPERATIONS));
    let els = split_compound(&f).unwrap();
    assert_eq!(els.len(), 2);
    assert_eq!(els[0].bytes.len(), 72);
    assert_eq!(els[1].offset, 72);
    assert!(els[1].is_related());
}

#[test]
fn misaligned_next_command() {
    let mut f = padded(echo(68, 0), 68);
    f.extend(echo(0, 0));
    invalid_parameter(split_compound(&f).unwrap_err());
}

#[test]
fn next_command_outside_the_frame() {
    let f = padded(echo(4096, 0), 80);
    invalid_parameter(split_compound(&f).unwrap_err());
}

#[test]
fn next_command_overlapping_the_header() {
    let mut f = padded(echo(8, 0), 72);
    f.extend(echo(0, 0));
    invalid_parameter(split_compound(&f).unwrap_err());
}

#[test]
fn next_command_leaving_a_partial_header() {
    let mut f = padded(echo(72, 0), 72);
    f.extend_from_slice(&echo(0, 0)[..40]);
    invalid_parameter(split_compound(&f).unwrap_err());
}

#[test]
fn garbage_after_next_command() {
    let mut f = padded(echo(72, 0), 72);
    f.extend_from_slice(&[0xAB; 80]);
    invalid_parameter(split_compound(&f).unwrap_err());
}

#[test]
fn first_message_marked_related() {
    invalid_parameter(split_compound(&echo(0, Flags::RELATED_OPERATIONS)).unwrap_err());
}

#[test]
fn non_smb2_first_header_disconnects() {
    let mut f = echo(0, 0);
    f[0] = 0xFF;
    assert_eq!(split_compound(&f).unwrap_err().answer(), Answer::Disconnect);
    assert_eq!(
        split_compound(&f[..30]).unwrap_err().answer(),
        Answer::Disconnect
    );
}

#[test]
fn framing_limits() {
    let t = DirectTcp { max_frame: 100 };
    assert_eq!(t.decode(&[0, 0, 0]).unwrap(), None);
    assert_eq!(t.decode(&[0, 0, 0, 2, 9]).unwrap(), None);
    assert_eq!(
        t.decode(&[0, 0, 0, 2, 9, 8, 7]).unwrap(),
        Some((6, &[9u8, 8][..]))
    );
    assert_eq!(
        t.decode(&[0, 0, 0, 101]).unwrap_err().answer(),
        Answer::Disconnect
    );
    assert_eq!(
        t.decode(&[0x85, 0, 0, 1, 0]).unwrap_err().answer(),
        Answer::Disconnect
    );
    assert_eq!(DirectTcp::prefix(0x0100_0000), None);
    assert_eq!(DirectTcp::prefix(0x12_3456), Some([0, 0x12, 0x34, 0x56]));
}

#[test]
fn body_errors_answer_invalid_parameter() {
    let mut m = echo(0, 0);
    m[64] = 5; // StructureSize
    let h = Header::decode(&m).unwrap();
    invalid_parameter(smb_proto::msg::Request::decode(&h, &m).unwrap_err());
    let mut h2 = h.clone();
    h2.command = Command::Other(0x99);
    invalid_parameter(smb_proto::msg::Request::decode(&h2, &m).unwrap_err());
}

#[test]
fn partial_split_keeps_the_good_prefix() {
    let mut f = padded(echo(72, 0), 72);
    f.extend(padded(echo(76, Flags::RELATED_OPERATIONS), 80));
    f.extend(echo(0, 0));
    let (good, err) = smb_proto::split_compound_partial(&f);
    assert_eq!(good.len(), 1);
    assert_eq!(good[0].header.next_command, 72);
    let err = err.unwrap();
    assert!(
        matches!(err, DecodeError::Compound { index: 1, .. }),
        "{err:?}"
    );
    invalid_parameter(err);
    let one = echo(0, 0);
    let (all, none) = smb_proto::split_compound_partial(&one);
    assert_eq!((all.len(), none), (1, None));
}
