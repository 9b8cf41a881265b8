#include "core/op_scope.h"

namespace stateflow {

OpTimer*& thread_op_timer() {
  thread_local OpTimer* timer = nullptr;
  return timer;
}

bool& op_timer_keeps_overlap() {
  static bool keeps = false;
  return keeps;
}

}  // namespace stateflow
