//! The upload reference system, the seed's async hand-off shape: the slow
//! work after an upload (an antivirus scan, a thumbnail, the search index)
//! leaves the request path, each stage a command on its own work queue
//! handled by competing consumers with bounded concurrency.
//!
//! Run it with `tidings demo upload` (see docs/SHAPES.md); [`demo::run`] is the same from code.
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

pub mod demo;
pub mod handlers;
pub mod messages;
pub mod sql;
pub mod system;

pub use demo::{Summary, UploadOptions};

/// The schema registry of the upload system's messages (committed in `examples/upload/schemas`).
pub fn schemas() -> tidings_schema::Registry {
    use messages::*;
    tidings_schema::Registry::new()
        .register::<UploadFinished>()
        .register::<ScanFile>()
        .register::<MakeThumbnail>()
        .register::<IndexDocument>()
        .register::<FileQuarantined>()
}

/// Who sends and receives what, for its AsyncAPI document.
pub fn topology() -> tidings_schema::asyncapi::Topology {
    use messages::*;
    use tidings_schema::asyncapi::{Service, Topology};
    Topology::new("Upload", "1.0.0")
        .description(
            "The upload reference system: the upload service stores a file and queues its scan; the antivirus \
             quarantines it or queues its thumbnail; the thumbnailer queues its indexing; the indexer calls the \
             search API once.",
        )
        .service(Service::new("upload-api").sends::<UploadFinished>().sends::<ScanFile>())
        .service(
            Service::new("antivirus")
                .receives::<ScanFile>()
                .sends::<FileQuarantined>()
                .sends::<MakeThumbnail>(),
        )
        .service(Service::new("thumbnailer").receives::<MakeThumbnail>().sends::<IndexDocument>())
        .service(Service::new("indexer").receives::<IndexDocument>())
        .service(Service::new("catalog").receives::<UploadFinished>().receives::<FileQuarantined>())
}
