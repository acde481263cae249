//! The JSON of etcd's v3 gateway for the two calls the witness makes: a range on one key and a
//! transaction guarded by that key's revision. Keys and values are base64; 64-bit numbers are
//! JSON strings; fields at their default value (false, 0, empty) are left out by etcd.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use serde::Deserialize;
use serde_json::json;

/// `POST /v3/kv/range` for `key`.
pub const RANGE: &str = "/v3/kv/range";
/// `POST /v3/kv/txn`.
pub const TXN: &str = "/v3/kv/txn";

/// The body of a range request for one key.
pub fn range(key: &str) -> Vec<u8> {
    json!({ "key": B64.encode(key) }).to_string().into_bytes()
}

/// The body of: if `key`'s mod revision is `revision` (0: the key does not exist), put
/// `value`; otherwise read the key.
pub fn put_if_revision(key: &str, revision: i64, value: &[u8]) -> Vec<u8> {
    let key = B64.encode(key);
    let compare = if revision == 0 {
        json!({ "target": "CREATE", "result": "EQUAL", "key": key, "create_revision": "0" })
    } else {
        json!({ "target": "MOD", "result": "EQUAL", "key": key, "mod_revision": revision.to_string() })
    };
    json!({
        "compare": [compare],
        "success": [{ "request_put": { "key": key, "value": B64.encode(value) } }],
        "failure": [{ "request_range": { "key": key } }],
    })
    .to_string()
    .into_bytes()
}

/// A key's value and modification revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValue {
    pub value: Vec<u8>,
    pub mod_revision: i64,
}

/// What a transaction did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxnResult {
    /// The compare held and the put was applied at `revision`.
    Applied { revision: i64 },
    /// The compare failed; the key as it is now (`None`: absent).
    Failed { current: Option<KeyValue> },
}

#[derive(Deserialize)]
struct Header {
    #[serde(default)]
    revision: Option<String>,
}

#[derive(Deserialize)]
struct RawKv {
    #[serde(default)]
    value: String,
    #[serde(default)]
    mod_revision: Option<String>,
}

#[derive(Deserialize)]
struct RawRange {
    #[serde(default)]
    kvs: Vec<RawKv>,
}

#[derive(Deserialize)]
struct RawTxnResponse {
    #[serde(default)]
    response_range: Option<RawRange>,
}

#[derive(Deserialize)]
struct RawTxn {
    header: Option<Header>,
    #[serde(default)]
    succeeded: bool,
    #[serde(default)]
    responses: Vec<RawTxnResponse>,
}

fn number(text: Option<&String>, what: &str) -> Result<i64, String> {
    match text {
        None => Ok(0),
        Some(t) => t
            .parse()
            .map_err(|_| format!("{what} {t:?} is not a number")),
    }
}

fn key_value(raw: &RawKv) -> Result<KeyValue, String> {
    Ok(KeyValue {
        value: B64
            .decode(&raw.value)
            .map_err(|e| format!("value is not base64: {e}"))?,
        mod_revision: number(raw.mod_revision.as_ref(), "mod_revision")?,
    })
}

/// The key from a range response (`None`: absent).
pub fn parse_range(body: &[u8]) -> Result<Option<KeyValue>, String> {
    let raw: RawRange = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    raw.kvs.first().map(key_value).transpose()
}

/// A transaction response from [`put_if_revision`].
pub fn parse_txn(body: &[u8]) -> Result<TxnResult, String> {
    let raw: RawTxn = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    if raw.succeeded {
        let revision = number(
            raw.header.as_ref().and_then(|h| h.revision.as_ref()),
            "revision",
        )?;
        return Ok(TxnResult::Applied { revision });
    }
    let current = raw
        .responses
        .iter()
        .find_map(|r| r.response_range.as_ref())
        .ok_or("a failed transaction without its range")?
        .kvs
        .first()
        .map(key_value)
        .transpose()?;
    Ok(TxnResult::Failed { current })
}

#[cfg(test)]
mod tests {
    use super::*;

    // Bodies as etcd 3.4.23's gateway answered them (key /lanes/x, value "hi").
    const RANGE_EMPTY: &str = r#"{"header":{"cluster_id":"15118495548433857066","member_id":"13668033151171901709","revision":"1","raft_term":"2"}}"#;
    const RANGE_ONE: &str = r#"{"header":{"cluster_id":"15118495548433857066","member_id":"13668033151171901709","revision":"2","raft_term":"2"},"kvs":[{"key":"L2xhbmVzL3g=","create_revision":"2","mod_revision":"2","version":"1","value":"aGk="}],"count":"1"}"#;
    const TXN_APPLIED: &str = r#"{"header":{"cluster_id":"15118495548433857066","member_id":"13668033151171901709","revision":"2","raft_term":"2"},"succeeded":true,"responses":[{"response_put":{"header":{"revision":"2"}}}]}"#;
    const TXN_FAILED: &str = r#"{"header":{"cluster_id":"15118495548433857066","member_id":"13668033151171901709","revision":"2","raft_term":"2"},"responses":[{"response_range":{"header":{"revision":"2"},"kvs":[{"key":"L2xhbmVzL3g=","create_revision":"2","mod_revision":"2","version":"1","value":"aGk="}],"count":"1"}}]}"#;

    #[test]
    fn range_answers() {
        assert_eq!(parse_range(RANGE_EMPTY.as_bytes()), Ok(None));
        assert_eq!(
            parse_range(RANGE_ONE.as_bytes()),
            Ok(Some(KeyValue {
                value: b"hi".to_vec(),
                mod_revision: 2
            }))
        );
    }

    #[test]
    fn txn_answers() {
        assert_eq!(
            parse_txn(TXN_APPLIED.as_bytes()),
            Ok(TxnResult::Applied { revision: 2 })
        );
        assert_eq!(
            parse_txn(TXN_FAILED.as_bytes()),
            Ok(TxnResult::Failed {
                current: Some(KeyValue {
                    value: b"hi".to_vec(),
                    mod_revision: 2
                })
            })
        );
        assert!(parse_txn(b"{}").is_err());
        assert!(
            parse_txn(br#"{"responses":[{"response_range":{"kvs":[{"value":"!!"}]}}]}"#).is_err()
        );
        assert!(parse_range(b"[1,2]").is_err());
    }

    #[test]
    fn a_create_compares_the_create_revision_and_an_update_the_mod_revision() {
        let create: serde_json::Value =
            serde_json::from_slice(&put_if_revision("/k", 0, b"v")).unwrap();
        assert_eq!(create["compare"][0]["target"], "CREATE");
        assert_eq!(create["compare"][0]["create_revision"], "0");
        let update: serde_json::Value =
            serde_json::from_slice(&put_if_revision("/k", 42, b"v")).unwrap();
        assert_eq!(update["compare"][0]["target"], "MOD");
        assert_eq!(update["compare"][0]["mod_revision"], "42");
        assert_eq!(update["success"][0]["request_put"]["value"], "dg==");
        assert_eq!(update["failure"][0]["request_range"]["key"], "L2s=");
    }
}
