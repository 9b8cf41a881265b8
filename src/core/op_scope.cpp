#include "core/op_scope.h"

namespace stateflow {

OpTimer*& thread_op_timer() {
  thread_local OpTimer* timer = nullptr;
  return timer;
}

}  // namespace stateflow
