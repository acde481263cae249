//! The tokio side: one short HTTP connection per call, endpoints tried in order, every call
//! bounded by the timeout.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::gateway::{self, KeyValue, TxnResult};
use crate::http::{self, ResponseReader};
use crate::record::{EpochRecord, NodeId};
use crate::Error;

/// Where the witness is and who asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WitnessConfig {
    /// etcd client URLs' addresses (`http://` only).
    pub endpoints: Vec<SocketAddr>,
    /// The cluster's epoch key, e.g. `/lanes/<cluster>/epoch`.
    pub key: String,
    pub node: NodeId,
    /// Limit for one call on one endpoint (connect, send, answer).
    pub timeout: Duration,
}

/// The record with the revision it was read at (0: nothing stored yet).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Versioned {
    pub record: EpochRecord,
    pub revision: i64,
}

/// What a claim or a rejoin came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Stored: this is now the record.
    Won(Versioned),
    /// Another write came first (or the transition is refused): the record as it is.
    Lost(Versioned),
}

/// The etcd-backed witness of one cluster, as seen by one node.
#[derive(Debug, Clone)]
pub struct Witness {
    config: WitnessConfig,
}

impl Witness {
    pub fn new(config: WitnessConfig) -> Self {
        Self { config }
    }

    pub fn node(&self) -> NodeId {
        self.config.node
    }

    /// The current record; a cluster that has none gets [`EpochRecord::FIRST`] (created once,
    /// whoever asks first).
    pub async fn read(&self) -> Result<Versioned, Error> {
        let body = self
            .call(gateway::RANGE, gateway::range(&self.config.key))
            .await?;
        let current = gateway::parse_range(&body).map_err(|r| self.protocol(r))?;
        match current {
            Some(kv) => self.decode(&kv),
            None => {
                let first = Versioned {
                    record: EpochRecord::FIRST,
                    revision: 0,
                };
                match self.put_if(&first, &EpochRecord::FIRST).await? {
                    Outcome::Won(v) | Outcome::Lost(v) => Ok(v),
                }
            }
        }
    }

    /// Acknowledge alone from `seen` on (see [`EpochRecord::claim`]); lost when the record
    /// changed since `seen` or this node is outdated in it.
    pub async fn claim(&self, seen: &Versioned) -> Result<Outcome, Error> {
        match seen.record.claim(self.config.node) {
            Ok(next) => self.put_if(seen, &next).await,
            Err(_) => Ok(Outcome::Lost(*seen)),
        }
    }

    /// End this node's epoch alone after a resync (see [`EpochRecord::rejoin`]).
    pub async fn rejoin(&self, seen: &Versioned) -> Result<Outcome, Error> {
        match seen.record.rejoin(self.config.node) {
            Ok(next) => self.put_if(seen, &next).await,
            Err(_) => Ok(Outcome::Lost(*seen)),
        }
    }

    async fn put_if(&self, seen: &Versioned, next: &EpochRecord) -> Result<Outcome, Error> {
        let body = gateway::put_if_revision(&self.config.key, seen.revision, &next.to_json());
        let answer = self.call(gateway::TXN, body).await?;
        match gateway::parse_txn(&answer).map_err(|r| self.protocol(r))? {
            TxnResult::Applied { revision } => Ok(Outcome::Won(Versioned {
                record: *next,
                revision,
            })),
            TxnResult::Failed { current: Some(kv) } => Ok(Outcome::Lost(self.decode(&kv)?)),
            TxnResult::Failed { current: None } => {
                Err(self.protocol("the compare failed but the key does not exist".to_string()))
            }
        }
    }

    fn decode(&self, kv: &KeyValue) -> Result<Versioned, Error> {
        let record = EpochRecord::from_json(&kv.value).map_err(|reason| Error::Record {
            key: self.config.key.clone(),
            reason,
        })?;
        Ok(Versioned {
            record,
            revision: kv.mod_revision,
        })
    }

    fn protocol(&self, reason: String) -> Error {
        Error::Protocol {
            endpoint: self.endpoints(),
            reason,
        }
    }

    fn endpoints(&self) -> String {
        self.config
            .endpoints
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// One call: each endpoint in turn until one answers 200.
    async fn call(&self, path: &str, body: Vec<u8>) -> Result<Vec<u8>, Error> {
        let mut reasons = Vec::new();
        for endpoint in &self.config.endpoints {
            let request = http::post(&endpoint.to_string(), path, &body);
            match tokio::time::timeout(self.config.timeout, exchange(*endpoint, &request)).await {
                Ok(Ok(response)) if response.status == 200 => return Ok(response.body),
                Ok(Ok(response)) => reasons.push(format!(
                    "{endpoint}: HTTP {} {}",
                    response.status,
                    String::from_utf8_lossy(&response.body).trim()
                )),
                Ok(Err(e)) => reasons.push(format!("{endpoint}: {e}")),
                Err(_) => reasons.push(format!(
                    "{endpoint}: no answer within {} ms",
                    self.config.timeout.as_millis()
                )),
            }
        }
        Err(Error::Unreachable {
            endpoints: self.endpoints(),
            reason: reasons.join("; "),
        })
    }
}

async fn exchange(endpoint: SocketAddr, request: &[u8]) -> Result<http::Response, String> {
    let mut stream = TcpStream::connect(endpoint)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    stream
        .write_all(request)
        .await
        .map_err(|e| format!("send: {e}"))?;
    let mut reader = ResponseReader::default();
    let mut buf = [0u8; 4096];
    loop {
        let n = stream
            .read(&mut buf)
            .await
            .map_err(|e| format!("receive: {e}"))?;
        reader.feed(&buf[..n]).map_err(|e| e.to_string())?;
        if let Some(response) = reader.response(n == 0).map_err(|e| e.to_string())? {
            return Ok(response);
        }
    }
}
