#include "dispatch.hpp"

#include <exception>
#include <new>
#include <string>

#include "format.hpp"
#include "tally/core/types.hpp"

namespace tally::cli {

CommandOutcome run_command_line(CLI::App& app, int argc, const char* const* argv,
                                std::ostream& help) {
  auto failed = [](int code, const std::string& what) {
    return CommandOutcome{.exit_code = code, .error = "tally: error: " + what};
  };
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return {.exit_code = app.exit(e, help, help)};
  } catch (const CLI::CallForAllHelp& e) {
    return {.exit_code = app.exit(e, help, help)};
  } catch (const CLI::CallForVersion& e) {
    return {.exit_code = app.exit(e, help, help)};
  } catch (const CLI::ParseError& e) {
    // One line naming the flag, the value and what is allowed; exit 2 (bad input).
    return failed(kBadInput, e.what());
  } catch (const tally::InvalidInput& e) {
    return failed(kBadInput, e.what());
  } catch (const std::bad_alloc&) {
    return failed(kRunFailed, "out of memory");
  } catch (const std::exception& e) {
    // Its first line: libtorch's c10::Error appends a C++ backtrace to what() (tally's own errors
    // are one line).
    const std::string what = e.what();
    return failed(kRunFailed, what.substr(0, what.find('\n')));
  }
  return {};
}

}  // namespace tally::cli
