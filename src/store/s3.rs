//! `S3Store`: objects in an S3-compatible bucket through `aws-sdk-s3` (Garage, MinIO, AWS S3).
pub struct S3Store;
pub struct S3Settings;
