#include "model/placement.h"

namespace dstrain::model {

int Placement::dim() const {
  switch (kind) {
    case PlacementKind::kReplicated:
      return -1;
    case PlacementKind::kRow:
      return 1;
    case PlacementKind::kColumn:
    case PlacementKind::kVocabulary:
    case PlacementKind::kExperts:
      return 0;
  }
  return -1;
}

std::string to_string(const Placement& p) {
  std::string word;
  switch (p.kind) {
    case PlacementKind::kReplicated:
      word = "replicated";
      break;
    case PlacementKind::kColumn:
      word = "column";
      break;
    case PlacementKind::kRow:
      word = "row";
      break;
    case PlacementKind::kVocabulary:
      word = "vocabulary";
      break;
    case PlacementKind::kExperts:
      word = "experts";
      break;
  }
  if (p.group == PlacementGroup::kExpert) word += " over the expert-parallel ranks";
  return p.partial_gradient ? word + " (partial gradient)" : word;
}

}  // namespace dstrain::model
