// tpcli::dist — the zmq backend's stand-in in a build without ZeroMQ (CMake TPCLI_ZMQ=OFF): asking
// for the backend is a one-line error. (The launcher and ZmqConfig need no ZeroMQ and stay.)
#include <stdexcept>

#include "distributed/zmq/zmq_backend.h"

namespace tpcli::dist {

bool zmq_available() { return false; }

void use_zmq_backend(RunOptions&, const ZmqConfig&) {
  throw std::invalid_argument("backend zmq: this tpcli was built without ZeroMQ (install libzmq3-dev cppzmq-dev and rebuild with -DTPCLI_ZMQ=ON)");
}

}  // namespace tpcli::dist
