// C++: iostream, std::string, std::vector, exceptions and std::thread.
// lwk-test: libcs=glibc
#include <iostream>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

int main() {
    std::vector<int> numbers(100);
    std::iota(numbers.begin(), numbers.end(), 1);
    std::cout << "sum " << std::accumulate(numbers.begin(), numbers.end(), 0) << std::endl;
    try {
        throw std::runtime_error("caught");
    } catch (const std::exception &error) {
        std::cout << "exception " << error.what() << std::endl;
    }
    std::vector<long> partial(4);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; t++)
        threads.emplace_back([&, t] {
            for (int i = t; i < 100; i += 4)
                partial[t] += numbers[i];
        });
    for (auto &thread : threads)
        thread.join();
    std::cout << "threads " << std::string(3, '=') << " " << std::accumulate(partial.begin(), partial.end(), 0L) << std::endl;
    return 0;
}
