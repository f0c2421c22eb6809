#pragma once
// Progress of one file's download. On a terminal (stderr is a tty) a bar is redrawn in place at
// most ten times a second; otherwise a few plain lines on stdout: the start, one every 30 s, and
// the end (a file under 10 MB that starts from zero gets only the end). Lines are printed by
// whichever rank downloads (one per node), not only by rank 0.

#include <chrono>
#include <cstdint>
#include <string>

namespace dstrain::hub {

class DownloadProgress {
 public:
  // `total` < 0 when unknown; `done` bytes are already on disk (a resumed download).
  DownloadProgress(std::string name, int64_t total, int64_t done, bool terminal);
  void advance(int64_t bytes);
  void restart();  // the bytes on disk were discarded; counting starts at 0
  void finish();

 private:
  void draw(bool final);
  void line(const std::string& text) const;

  std::string name_;
  int64_t total_;
  int64_t done_;
  int64_t start_done_;
  bool terminal_;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

// Whether stderr is a terminal.
bool stderr_is_terminal();

// 1536 → "1.5 KB", in powers of 1000 as huggingface_hub's bars show them.
std::string human_bytes(double bytes);

}  // namespace dstrain::hub
