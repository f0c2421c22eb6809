#pragma once
// File-system helpers. Every durable file dstrain writes goes through write_file_atomic: the bytes
// go to a temporary file in the same directory, are fsync'ed, renamed over the target and the
// directory is fsync'ed, so a crash at any instant leaves either the old file or the complete new
// one. Errors are Error(kIo) naming the path and the OS reason.

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace dstrain::fs {

namespace stdfs = std::filesystem;

// Whole file as bytes; Error(kIo) "cannot read <path>: <reason>".
std::string read_file(const stdfs::path& path);

// Atomically replaces `path` with `data` (temp + fsync + rename + fsync of the directory).
void write_file_atomic(const stdfs::path& path, std::string_view data);

// fsync of a directory, so a rename or a new file inside it is durable.
void fsync_dir(const stdfs::path& dir);

// fsync of an already written file.
void fsync_file(const stdfs::path& path);

// Creates the directory and its parents; Error(kIo) naming it on failure.
void create_dirs(const stdfs::path& dir);

}  // namespace dstrain::fs
