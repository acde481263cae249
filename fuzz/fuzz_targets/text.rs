//! Fuzz target: the text-key parser, the value parsers and the full-feature key answers.
#![no_main]

use iscsi_proto::negotiation::SessionType;
use iscsi_proto::text;
use iscsi_proto::text_exchange::{answer_keys, TextContext};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(pairs) = text::parse_allow_repeats(data) {
        for (_, value) in &pairs {
            let _ = text::parse_number(value);
            let _ = text::decode_binary(value);
            let _ = text::parse_bool(value);
            let _ = text::parse_list(value).count();
        }
        // Parsing what we encode gives the same pairs back.
        let again = text::encode(&pairs);
        assert_eq!(text::parse_allow_repeats(&again).ok(), Some(pairs));
    }
    let targets = vec![(
        "iqn.2026-01.org.lanes:t".to_string(),
        vec![("[::1]:3260".parse().unwrap(), 1)],
    )];
    for session_type in [SessionType::Discovery, SessionType::Normal] {
        let ctx = TextContext {
            session_type,
            current_target: Some("iqn.2026-01.org.lanes:t"),
            targets: &targets,
            max_recv_data_segment_length: 8192,
        };
        let _ = answer_keys(data, &ctx);
    }
});
