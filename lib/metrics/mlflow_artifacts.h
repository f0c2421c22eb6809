#pragma once
// Where an MLflow run's artifacts go, decided from the run's artifact URI as MLflow's own client
// decides it (mlflow/store/artifact/artifact_repository_registry.py):
//  - "mlflow-artifacts:..."  through the tracking server's artifact proxy (`mlflow server`
//    serves artifacts by default): an HTTP PUT, MlflowClient::upload_artifact;
//  - a plain path or a "file:" URI (a server started with --default-artifact-root /nfs/mlruns, the
//    usual setup on a shared file system, or one whose backend store is a directory): the files
//    are written straight into that directory, as MLflow's LocalArtifactRepository does;
//  - anything else (s3://, gs://, hdfs://, ...): dstrain does not write there.

#include <string>

namespace dstrain::metrics {

// True for "mlflow-artifacts:" URIs, which the tracking server's artifact proxy serves.
bool is_proxied_artifact_uri(const std::string& artifact_uri);

// The local directory a plain-path or file: artifact URI names, percent-decoded: "/a/b",
// "file:///a/b", "file:/a/b" and "file://localhost/a/b" are all "/a/b". "" for every other URI,
// for a file: URI naming another host and for a relative path (relative to the server's working
// directory, which this machine cannot know).
std::string local_artifact_dir(const std::string& artifact_uri);

// Writes `content` to <local_artifact_dir(artifact_uri)>/<path>, creating the directories below
// the artifact root, atomically (temporary file + rename, as MLflow's client; mode 0644 less the
// umask). The location must be reachable from this machine: the artifact root (the directory
// holding the experiment's directory in <root>/<experiment>/<run>/artifacts: the server's
// --default-artifact-root or its file store) must exist here. When it does not (a shared file
// system not mounted on this node) nothing is created, and Error(kIo) says so, as it does for a
// URI that is neither proxied nor local, and for a write that fails.
void write_local_artifact(const std::string& artifact_uri, const std::string& path,
                          const std::string& content);

}  // namespace dstrain::metrics
