// Under AddressSanitizer or ThreadSanitizer, an allocation too large to satisfy returns null
// (as plain malloc does) instead of aborting, so the tests of the out-of-memory message run
// there too. Without a sanitizer these functions are never called.
extern "C" const char* __asan_default_options() { return "allocator_may_return_null=1"; }
extern "C" const char* __tsan_default_options() { return "allocator_may_return_null=1"; }
