// One loader instance per vendor for the whole process.
#include "loader.h"
#include "common.h"
#include <mutex>

namespace rtc {

Loader& get_loader(const std::string& vendor) {
  static std::mutex mu;
  static std::unique_ptr<Loader> hip, cuda, host;
  std::lock_guard<std::mutex> lock(mu);
  if (vendor == "hip") return *(hip ? hip : hip = make_hip_loader());
  if (vendor == "cuda") return *(cuda ? cuda : cuda = make_cuda_loader());
  if (vendor == "host") return *(host ? host : host = make_host_loader());
  RTC_FAIL(RTC_ERR_ARG, "vendor " + quote(vendor) + " is not known; accepted: hip, cuda, host");
}

}  // namespace rtc
