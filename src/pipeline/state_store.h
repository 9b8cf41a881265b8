// Boundary states between chunks, kept outside the layers and keyed by (layer, microbatch,
// chunk). put() stores what chunk c emitted; take() hands it to its one consumer and drops
// the store's reference, so a state lives exactly as long as someone still needs it.
#pragma once
#include <map>
#include <tuple>

#include "model/layer.h"

namespace stateflow {

class StateStore {
 public:
  void put(int layer, int microbatch, int chunk, State s) { map_[{layer, microbatch, chunk}] = std::move(s); }
  // The state stored under the key, removed from the store; empty (= zeros) if none.
  State take(int layer, int microbatch, int chunk) {
    auto it = map_.find({layer, microbatch, chunk});
    if (it == map_.end()) return {};
    State s = std::move(it->second);
    map_.erase(it);
    return s;
  }
  size_t size() const { return map_.size(); }
  void clear() { map_.clear(); }

 private:
  std::map<std::tuple<int, int, int>, State> map_;
};

}  // namespace stateflow
