! A Fortran program built the default way (gfortran, dynamically linked: libgfortran,
! libquadmath, libm): arguments, environment, allocatable arrays, formatted output, a file
! read, and an exit status. lwk-test: libcs=dynamic
program fortran
    implicit none
    integer :: i, n, status
    character(len=64) :: argument, greeting
    character(len=128) :: line
    real(8), allocatable :: x(:)

    do i = 0, command_argument_count()
        call get_command_argument(i, argument)
        print '(a,i0,a,a)', 'argv[', i, '] = ', trim(argument)
    end do
    call get_environment_variable('GREETING', greeting, status=status)
    if (status == 0) then
        print '(a,a)', 'GREETING = ', trim(greeting)
    else
        print '(a)', 'GREETING = (unset)'
    end if

    n = 100000
    allocate(x(n))
    do i = 1, n
        x(i) = 1.0d0 / real(i, 8)**2
    end do
    print '(a,f18.15)', 'sum 1/i^2 = ', sum(x)
    print '(a,es12.5)', 'sqrt(6 sum) = ', sqrt(6.0d0 * sum(x))
    deallocate(x)

    open(unit=10, file='files/input.txt', status='old', action='read', iostat=status)
    if (status /= 0) then
        print '(a,i0)', 'open failed: ', status
    else
        read(10, '(a)') line
        print '(a,a)', 'first line: ', trim(line)
        close(10)
    end if
    call exit(3)
end program fortran
