//! The upload pipeline's messages: one event when a file is in, a
//! command per stage on its work queue, and an event when a file is set
//! aside. Every message is keyed by the file.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tidings_core::{Kind, Message};

/// Where the file's story is told (its upload, its quarantine).
pub const UPLOADS: &str = "uploads";
/// The antivirus's work queue.
pub const SCAN: &str = "jobs.scan";
/// The thumbnailer's work queue.
pub const THUMBNAIL: &str = "jobs.thumbnail";
/// The indexer's work queue.
pub const INDEX: &str = "jobs.index";

/// A file is uploaded and stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct UploadFinished {
    /// The file.
    pub file_id: String,
    /// Its name as uploaded.
    pub name: String,
    /// Its size.
    pub bytes: i64,
    /// Its step in the file's story (1).
    pub step: i64,
}

/// Scan the file for malware.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ScanFile {
    /// The file.
    pub file_id: String,
}

/// Make the file's thumbnail.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct MakeThumbnail {
    /// The file.
    pub file_id: String,
}

/// Put the file in the search index.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct IndexDocument {
    /// The file.
    pub file_id: String,
    /// Its thumbnail's digest, shown in search results.
    pub thumbnail: String,
}

/// The antivirus found malware: the file goes no further.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct FileQuarantined {
    /// The file.
    pub file_id: String,
    /// What the antivirus found.
    pub signature: String,
    /// Its step in the file's story (2).
    pub step: i64,
}

macro_rules! message {
    ($ty:ident, $kind:ident, $topic:expr) => {
        impl Message for $ty {
            const TYPE: &'static str = stringify!($ty);
            const VERSION: u32 = 1;
            const KIND: Kind = Kind::$kind;
            const AGGREGATE: &'static str = "file";
            const TOPIC: &'static str = $topic;
            fn key(&self) -> String {
                self.file_id.clone()
            }
        }
    };
}

message!(UploadFinished, Event, UPLOADS);
message!(ScanFile, Command, SCAN);
message!(MakeThumbnail, Command, THUMBNAIL);
message!(IndexDocument, Command, INDEX);
message!(FileQuarantined, Event, UPLOADS);
